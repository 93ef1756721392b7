"""Set-ups that several engine test modules share, each built once per session."""
from __future__ import annotations

from pathlib import Path

import pytest

from memorised import train_memorised
from test_train_grpo import MODEL, run
from test_train_torchrun import TINY


@pytest.fixture(scope="session")
def memorised(tmp_path_factory) -> dict:
    """A tiny PP=2 checkpoint that has memorised 8 MMLU answers and a sentence (see ``memorised.py``)."""
    return train_memorised(tmp_path_factory.mktemp("memorised"))


@pytest.fixture(scope="session")
def base(tmp_path_factory) -> Path:
    """A plain language model's checkpoint (the GRPO tests' model, one pretraining step on synthetic tokens): the
    GRPO runs start from it, and a run that needs a reward model refuses it."""
    tmp = tmp_path_factory.mktemp("base")
    run(tmp, {**TINY, "model": MODEL, "training": {**TINY["training"], "trainIters": 1},
              "checkpoint": {"save": str(tmp / "ckpt")}})
    return tmp / "ckpt"
