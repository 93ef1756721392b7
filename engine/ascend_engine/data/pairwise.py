"""Preference pairs: the six datasets ``<prefix>_packed_{chosen,rejected}_{input_ids,attention_mask,labels}_document``
(one sequence per pair and side, prompt labels -100) and their micro-batches.

A micro-batch of ``m`` pairs is one model batch of ``2m`` rows, the chosen replies first and the rejected ones
after, padded to one length: the policy (and the reference) read both sides in a single forward pass.
"""
from __future__ import annotations

import numpy as np
import torch

from .batch import instruction_batch
from .instruction import InstructionDataset
from .sources import INSTRUCTION_KEYS

SIDES = ("chosen", "rejected")


class PairwiseDataset:
    """``dataset[i]`` is ``{"chosen": {input_ids, attention_mask, labels}, "rejected": {...}}``; both sides share
    the shuffled order of the chosen side's documents."""

    def __init__(self, files: dict[str, str], seed: int, split: str, name: str):
        self.sides = {side: InstructionDataset({k: files[f"{side}_{k}"] for k in INSTRUCTION_KEYS}, seed, split,
                                               f"{name} ({side})") for side in SIDES}
        counts = {side: len(d.indices) for side, d in self.sides.items()}
        if len(set(counts.values())) != 1:
            from .sources import DataError

            raise DataError(f"data.dataPath: {name} holds {counts['chosen']} chosen but {counts['rejected']} "
                            "rejected replies; prepare it again")

    def __getitem__(self, index: int) -> dict[str, dict[str, np.ndarray]]:
        return {side: self.sides[side][index] for side in SIDES}


def pairwise_batch(rows: list[dict], seq_length: int, variable: bool = False,
                   pad_to_multiple_of: int = 8) -> dict[str, torch.Tensor]:
    """``2m`` rows: chosen 0..m-1, then rejected 0..m-1 (same next-token targets and loss mask as SFT)."""
    flat = [r["chosen"] for r in rows] + [r["rejected"] for r in rows]
    return instruction_batch(flat, seq_length, variable, pad_to_multiple_of)
