"""The ORM objective against hand-computed values, the reward token it reads, and the config rules of stage orm."""
from __future__ import annotations

import math

import pytest
import torch

from ascend_engine.config.train import TrainConfig
from ascend_engine.models.score_head import last_token_index
from ascend_engine.train.stages.reward import pairwise_ranking_loss, sequence_rewards


def test_reward_is_the_score_of_the_last_real_token():
    # row 0: 3 tokens then padding (targets at positions 0, 1); row 1 fills the sequence (truncated reply)
    loss_mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 1.0, 1.0, 1.0]])
    assert last_token_index(loss_mask).tolist() == [2, 3]
    scores = torch.arange(8.0).reshape(2, 4, 1)
    assert sequence_rewards(scores, loss_mask).tolist() == [2.0, 7.0]


def test_pairwise_ranking_loss_by_hand():
    # two pairs, chosen rows first; rewards are the scores at positions 1 (rows 0, 2) and 2 (rows 1, 3)
    loss_mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    scores = torch.zeros(4, 3, 1)
    scores[0, 1], scores[1, 2], scores[2, 1], scores[3, 2] = 2.0, -1.0, 0.5, 0.0  # r_c = (2, -1), r_r = (0.5, 0)
    loss, metrics = pairwise_ranking_loss(loss_mask, scores)
    expected = (-math.log(1 / (1 + math.exp(-1.5))) - math.log(1 / (1 + math.exp(1.0)))) / 2
    assert loss.item() == pytest.approx(expected)
    assert metrics["rewards/chosen"].item() == pytest.approx(0.5)
    assert metrics["rewards/rejected"].item() == pytest.approx(0.25)
    assert metrics["rewards/margins"].item() == pytest.approx(0.25)
    assert metrics["rewards/accuracies"].item() == pytest.approx(0.5)


def test_orm_stage_rules():
    cfg = TrainConfig(stage="orm")
    assert cfg.model.scoreHead and cfg.pairwise_data
    assert not TrainConfig(stage="sft").model.scoreHead
    with pytest.raises(ValueError, match="model.scoreHead .* is the reward model of stage orm, not sft"):
        TrainConfig.model_validate({"stage": "sft", "model": {"scoreHead": True}})
    with pytest.raises(ValueError, match="stage orm with parallel.sequenceParallel"):
        TrainConfig.model_validate({"stage": "orm", "parallel": {"tensorModelParallelSize": 2,
                                                                 "sequenceParallel": True}})
