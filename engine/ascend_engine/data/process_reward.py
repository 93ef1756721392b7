"""Micro-batches of process reward data (``AlpacaStyleProcessRewardHandler`` output) for stage prm.

The labels of such data sit at the placeholder tokens themselves: the model's output at a step's placeholder is
read as that step's verdict, so, unlike the next-token ``instruction_batch``, labels are not shifted by one.
"""
from __future__ import annotations

import numpy as np
import torch

from .batch import IGNORE_INDEX, instruction_batch


def process_reward_batch(rows: list[dict[str, np.ndarray]], seq_length: int, variable: bool = False,
                         pad_to_multiple_of: int = 8) -> dict[str, torch.Tensor]:
    batch = instruction_batch(rows, seq_length, variable, pad_to_multiple_of)
    length = batch["tokens"].shape[1]
    labels = torch.full((len(rows), length), IGNORE_INDEX, dtype=torch.long)
    for row, r in zip(labels, rows):
        kept = np.asarray(r["labels"][:length], dtype=np.int64)
        row[:len(kept)] = torch.from_numpy(kept)
    batch["loss_mask"] = (labels != IGNORE_INDEX).float()
    batch["labels"] = labels.clamp(min=0)
    return batch
