"""Learnable synthetic tokens: a fixed repeating pattern, so a working trainer must drive the loss down.

Sample ``i`` is the pattern read from offset ``i``; the sample index alone decides the content, so the data
position after a resume is just the number of consumed samples.
"""
from __future__ import annotations

import torch

PATTERN_LENGTH = 17  # prime, so samples of any length start at many different phases


def pattern(vocab_size: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (PATTERN_LENGTH,), generator=gen)


def synthetic_sample(index: int, seq_length: int, vocab_size: int, seed: int) -> dict[str, torch.Tensor]:
    """tokens, labels (next tokens) and loss mask of one sample."""
    tokens = pattern(vocab_size, seed).roll(-(index % PATTERN_LENGTH))
    ids = tokens.repeat(-(-(seq_length + 1) // PATTERN_LENGTH))[: seq_length + 1]
    return {"tokens": ids[:-1], "labels": ids[1:], "loss_mask": torch.ones(seq_length, dtype=torch.float)}
