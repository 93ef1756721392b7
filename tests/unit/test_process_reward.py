"""Stage prm's micro-batches (labels at the placeholders, unshifted) and its config rules."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

from ascend_engine.config.train import TrainConfig
from ascend_engine.data.process_reward import process_reward_batch
from ascend_engine.train import command


def test_labels_stay_at_the_placeholders():
    rows = [{"input_ids": np.array([7, 8, 3, 9, 3]), "attention_mask": np.ones(5, dtype=np.int64),
             "labels": np.array([-100, -100, 5, -100, 6])},
            {"input_ids": np.array([10, 3]), "attention_mask": np.ones(2, dtype=np.int64),
             "labels": np.array([-100, 6])}]
    batch = process_reward_batch(rows, seq_length=6)
    assert batch["tokens"].tolist() == [[7, 8, 3, 9, 3, 0], [10, 3, 0, 0, 0, 0]]
    # the verdict of the step is read at the placeholder itself, not one position earlier
    assert batch["loss_mask"].tolist() == [[0, 0, 1, 0, 1, 0], [0, 1, 0, 0, 0, 0]]
    assert batch["labels"].tolist() == [[0, 0, 5, 0, 6, 0], [0, 6, 0, 0, 0, 0]]


def test_prm_rules(monkeypatch):
    prm = {"stage": "prm", "data": {"tokenizerNameOrPath": "/tok"}}
    with pytest.raises(ValueError, match="stage prm needs preference.rewardTokens"):
        TrainConfig.model_validate(prm)
    with pytest.raises(ValueError, match="names a token twice"):
        TrainConfig.model_validate(prm | {"preference": {"rewardTokens": ["+", "+"]}})
    with pytest.raises(ValueError, match="needs data.tokenizerNameOrPath"):
        TrainConfig.model_validate({"stage": "prm", "preference": {"rewardTokens": ["+", "-"]}})
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    monkeypatch.setenv("WORLD_SIZE", "1")
    cfg = command.load_config(parser.parse_args(["--stage", "prm", "--reward-tokens", "+", "-",
                                                 "--tokenizer-name-or-path", "/tok"]))
    assert cfg.preference.rewardTokens == ["+", "-"] and not cfg.model.scoreHead


def test_a_label_outside_the_reward_tokens_is_an_error():
    import torch

    from ascend_engine.train.stages.process_reward import step_classification_loss

    labels = torch.tensor([[0, 5, 0, 7]])
    mask = torch.tensor([[0.0, 1.0, 0.0, 1.0]])
    with pytest.raises(ValueError, match=r"tokens \[7\] at placeholders, which are not among preference.rewardTokens"):
        step_classification_loss(torch.tensor([5, 6]), labels, mask, torch.zeros(1, 4, 10))


def test_prm_reads_its_prefix_as_instruction_data_without_the_flag(tmp_path):
    from ascend_engine.data.build import build_train_data
    from ascend_engine.data.sources import DataError
    from ascend_engine.prep.indexed import IndexedDatasetWriter

    ids, labels = np.array([7, 8, 3, 9, 3]), np.array([-100, -100, 5, -100, 6])
    for key, row in (("input_ids", ids), ("attention_mask", np.ones_like(ids)), ("labels", labels)):
        w = IndexedDatasetWriter(str(tmp_path / f"steps_packed_{key}_document"), np.int32)
        w.add(row.astype(np.int32), np.array([len(row)]))
        w.finish()
        w.commit()
    cfg = TrainConfig.model_validate({"stage": "prm", "preference": {"rewardTokens": ["+", "-"]},
                                      "training": {"seqLength": 8, "microBatchSize": 1, "globalBatchSize": 1},
                                      "data": {"dataPath": [str(tmp_path / "steps")], "tokenizerNameOrPath": "/tok"}})
    data = build_train_data(cfg)
    batch = data.batch([data.datasets[0][0]])
    assert batch["loss_mask"][0].tolist() == [0, 0, 1, 0, 1, 0, 0, 0]
    assert batch["labels"][0, [2, 4]].tolist() == [5, 6]
    with pytest.raises(DataError, match="stage prm: needs process reward data"):
        build_train_data(TrainConfig.model_validate({**cfg.model_dump(), "data": {"tokenizerNameOrPath": "/tok"}}))
