"""Samples -> a micro-batch: inputs, next-token targets, loss mask, and for neat packing per-sample attention.

Pretraining windows hold ``seq_length + 1`` tokens: inputs are the first ``seq_length``, targets the last.
Instruction samples are padded (or cut) to ``length + 1`` and shifted the same way; a target counts only where
its label is not -100, so prompts, system text and padding never add to the loss. ``length`` is
``seq_length``, or with variable sequence lengths the longest sample of the micro-batch rounded up to
``pad_to_multiple_of``.

Neat-packed sequences number their samples 1..k in the attention mask (0 for padding). Each token then attends
only to earlier tokens of its own sample (a block-diagonal causal mask, True = masked as Megatron expects),
positions restart at 0 with every sample, and no target crosses from one sample into the next.
"""
from __future__ import annotations

import numpy as np
import torch

IGNORE_INDEX = -100


def pretrain_batch(rows: list[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
    text = torch.from_numpy(np.stack([r["text"] for r in rows]))
    return {"tokens": text[:, :-1], "labels": text[:, 1:], "loss_mask": torch.ones(text[:, 1:].shape)}


def batch_length(lengths: list[int], seq_length: int, variable: bool, multiple: int) -> int:
    """Input length of a micro-batch (one less than the longest sample, which the shift consumes)."""
    if not variable:
        return seq_length
    longest = max(max(lengths) - 1, 1)
    return min(-(-longest // multiple) * multiple, seq_length)


def _fit(values: np.ndarray, size: int, fill: int) -> np.ndarray:
    out = np.full(size, fill, dtype=np.int64)
    n = min(size, len(values))
    out[:n] = values[:n]
    return out


def segment_positions(segments: torch.Tensor) -> torch.Tensor:
    """Position of every token inside its own segment (0 at each segment's first token)."""
    b, s = segments.shape
    index = torch.arange(s).expand(b, s)
    starts = torch.ones_like(segments, dtype=torch.bool)
    starts[:, 1:] = segments[:, 1:] != segments[:, :-1]
    first = torch.cummax(torch.where(starts, index, torch.zeros_like(index)), dim=1).values
    return index - first


def block_causal_mask(segments: torch.Tensor) -> torch.Tensor:
    """[b, 1, s, s], True where query i must not see key j: j after i, or j in another segment."""
    s = segments.shape[1]
    same = segments[:, :, None] == segments[:, None, :]
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    return ~(same & causal)[:, None]


def instruction_batch(rows: list[dict[str, np.ndarray]], seq_length: int, variable: bool = False,
                      pad_to_multiple_of: int = 8, neat_pack: bool = False) -> dict[str, torch.Tensor]:
    length = batch_length([len(r["input_ids"]) for r in rows], seq_length, variable, pad_to_multiple_of)
    ids = np.stack([_fit(r["input_ids"], length + 1, 0) for r in rows])
    labels = np.stack([_fit(r["labels"], length + 1, IGNORE_INDEX) for r in rows])
    targets = torch.from_numpy(labels[:, 1:])
    loss_mask = targets != IGNORE_INDEX
    batch = {"tokens": torch.from_numpy(ids[:, :-1])}
    if neat_pack:
        segments = torch.from_numpy(np.stack([_fit(r["attention_mask"], length + 1, 0) for r in rows]))
        loss_mask &= (segments[:, 1:] == segments[:, :-1]) & (segments[:, :-1] > 0)
        batch["position_ids"] = segment_positions(segments[:, :-1])
        batch["attention_mask"] = block_causal_mask(segments[:, :-1])
    batch["labels"] = torch.where(loss_mask, targets, torch.zeros_like(targets))
    batch["loss_mask"] = loss_mask.float()
    return batch
