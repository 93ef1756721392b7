"""Split a full tensor into tensor-parallel shards and merge them back, by split kind (see mcore_layout)."""
from __future__ import annotations

import torch

from .errors import ConvertError


class ShardingError(ConvertError):
    """A tensor that cannot be split evenly over the requested tensor-parallel size."""


def cat(tensors: list[torch.Tensor], dim: int) -> torch.Tensor:
    """``torch.cat``, except that shape-only (meta) tensors get their result's shape directly: torch's meta
    kernel for ``cat`` is written in Python behind a guard that imports ``torch._dynamo``, which costs a second
    or more of a conversion's dry run."""
    if tensors[0].device.type != "meta":
        return torch.cat(tensors, dim=dim)
    first = tensors[0].shape
    for t in tensors[1:]:
        if t.dim() != len(first) or t.shape[:dim] != first[:dim] or t.shape[dim + 1:] != first[dim + 1:]:
            raise ValueError(f"cat: shapes {tuple(first)} and {tuple(t.shape)} differ outside dimension {dim}")
    shape = (*first[:dim], sum(t.shape[dim] for t in tensors), *first[dim + 1:])
    return torch.empty(shape, dtype=tensors[0].dtype, device="meta")


def _chunk(tensor: torch.Tensor, tp: int, dim: int, key: str) -> list[torch.Tensor]:
    if tensor.shape[dim] % tp:
        raise ShardingError(f"{key}: dimension {dim} of shape {tuple(tensor.shape)} is not divisible by "
                            f"tensor parallel size {tp}")
    return list(torch.chunk(tensor, tp, dim=dim))


def split(tensor: torch.Tensor, kind: str, tp: int, key: str) -> list[torch.Tensor]:
    """Shards for TP ranks 0..tp-1."""
    if kind == "replicated" or tp == 1:
        return [tensor] * tp
    if kind in ("column", "vocab"):
        return _chunk(tensor, tp, 0, key)
    if kind == "row":
        return _chunk(tensor, tp, 1, key)
    if kind == "gate_up":
        gate, up = _chunk(tensor, 2, 0, key)
        return [cat(list(pair), 0) for pair in zip(_chunk(gate, tp, 0, key), _chunk(up, tp, 0, key))]
    raise ValueError(f"unknown split kind {kind!r}")


def merge(shards: list[torch.Tensor], kind: str, key: str) -> torch.Tensor:
    """Inverse of ``split``; replicated tensors are taken from rank 0."""
    if kind == "replicated" or len(shards) == 1:
        return shards[0]
    if kind in ("column", "vocab"):
        return cat(shards, 0)
    if kind == "row":
        return cat(shards, 1)
    if kind == "gate_up":
        halves = [_chunk(s, 2, 0, key) for s in shards]
        return cat([h[0] for h in halves] + [h[1] for h in halves], 0)
    raise ValueError(f"unknown split kind {kind!r}")
