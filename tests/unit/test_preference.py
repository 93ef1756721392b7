"""The DPO / SimPO objectives against hand-computed values, and the config rules of the preference stages."""
from __future__ import annotations

import argparse
import math

import numpy as np
import pytest
import torch

from ascend_engine.config.loader import ConfigError
from ascend_engine.config.preference import PreferenceConfig
from ascend_engine.config.train import TrainConfig
from ascend_engine.data.pairwise import pairwise_batch
from ascend_engine.train import command
from ascend_engine.train.stages.preference_loss import dpo_losses, sequence_logps, simpo_losses

CHOSEN, REJECTED = torch.tensor([-3.0, -5.0]), torch.tensor([-4.0, -2.0])
REF_CHOSEN, REF_REJECTED = torch.tensor([-3.5, -4.0]), torch.tensor([-3.5, -3.0])


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_sequence_logps_sum_only_kept_tokens():
    losses = torch.tensor([[0.5, 1.0, 2.0], [0.25, 0.25, 9.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    logps, lengths = sequence_logps(losses, mask)
    assert logps.tolist() == [-3.0, -0.5] and lengths.tolist() == [2.0, 2.0]


@pytest.mark.parametrize("loss_type,smoothing", [("sigmoid", 0.0), ("sigmoid", 0.1), ("hinge", 0.0), ("ipo", 0.0)])
def test_dpo_losses_by_hand(loss_type, smoothing):
    beta = 0.5
    cfg = PreferenceConfig(dpoBeta=beta, dpoLossType=loss_type, dpoLabelSmoothing=smoothing)
    losses, chosen, rejected = dpo_losses(cfg, CHOSEN, REJECTED, REF_CHOSEN, REF_REJECTED)
    for i, (c, r, rc, rr) in enumerate(zip(CHOSEN.tolist(), REJECTED.tolist(), REF_CHOSEN.tolist(),
                                           REF_REJECTED.tolist())):
        h = (c - r) - (rc - rr)  # pair 0: 1 - 0 = 1; pair 1: -3 - (-1) = -2
        expected = {"sigmoid": -math.log(sigmoid(beta * h)) * (1 - smoothing) - math.log(sigmoid(-beta * h)) * smoothing,
                    "hinge": max(0.0, 1 - beta * h), "ipo": (h - 1 / (2 * beta)) ** 2}[loss_type]
        assert losses[i].item() == pytest.approx(expected, rel=1e-6)
        assert chosen[i].item() == pytest.approx(beta * (c - rc)) and rejected[i].item() == pytest.approx(beta * (r - rr))


def test_dpo_with_policy_equal_to_reference_is_ln2():
    losses, chosen, rejected = dpo_losses(PreferenceConfig(), CHOSEN, REJECTED, CHOSEN.clone(), REJECTED.clone())
    assert torch.all(losses == torch.tensor(math.log(2), dtype=torch.float32))
    assert torch.all(chosen == 0) and torch.all(rejected == 0)


@pytest.mark.parametrize("loss_type", ["sigmoid", "hinge"])
def test_simpo_losses_by_hand(loss_type):
    cfg = PreferenceConfig(simpoBeta=2.0, gammaBetaRatio=0.5, simpoLossType=loss_type)
    chosen_mean, rejected_mean = torch.tensor([-1.0]), torch.tensor([-2.0])
    losses, chosen, rejected = simpo_losses(cfg, chosen_mean, rejected_mean)
    z = 2.0 * (-1.0 + 2.0) - 2.0 * 0.5  # beta * margin of means - gamma, gamma = 0.5 x beta
    expected = -math.log(sigmoid(z)) if loss_type == "sigmoid" else max(0.0, 1 - z)
    assert losses.item() == pytest.approx(expected, rel=1e-6)
    assert (chosen.item(), rejected.item()) == (-2.0, -4.0)


def test_pairwise_batch_puts_chosen_rows_first_and_masks_prompts():
    def side(ids, labels):
        return {"input_ids": np.array(ids), "attention_mask": np.ones(len(ids), dtype=np.int64),
                "labels": np.array(labels)}

    rows = [{"chosen": side([5, 6, 7], [-100, 6, 7]), "rejected": side([5, 8, 9, 10], [-100, 8, 9, 10])},
            {"chosen": side([11, 12], [-100, 12]), "rejected": side([11, 13], [-100, 13])}]
    batch = pairwise_batch(rows, seq_length=4)
    assert batch["tokens"].tolist() == [[5, 6, 7, 0], [11, 12, 0, 0], [5, 8, 9, 10], [11, 13, 0, 0]]
    assert batch["loss_mask"].tolist() == [[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]]


def test_stage_rules(tmp_path, monkeypatch):
    assert TrainConfig(stage="dpo").pairwise_data and not TrainConfig().pairwise_data
    with pytest.raises(ValueError, match="isPairwiseDataset .* needs stage dpo or simpo"):
        TrainConfig.model_validate({"data": {"isPairwiseDataset": True}})
    with pytest.raises(ValueError, match="neatPack does not apply to pairwise data"):
        TrainConfig.model_validate({"stage": "dpo", "data": {"isPairwiseDataset": True, "neatPack": True}})
    path = tmp_path / "job.yaml"
    path.write_text("stage: dpo\npreference:\n  dpoLossType: kto\n")
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ConfigError, match=r"job.yaml:3: preference.dpoLossType"):
        command.load_config(parser.parse_args(["--config", str(path)]))
    cfg = command.load_config(parser.parse_args(["--config", str(path), "--dpo-loss-type", "ipo", "--dpo-beta",
                                                 "0.2", "--ref-model", "/ref", "--is-pairwise-dataset"]))
    assert (cfg.preference.dpoLossType, cfg.preference.dpoBeta, cfg.preference.refModel) == ("ipo", 0.2, "/ref")
