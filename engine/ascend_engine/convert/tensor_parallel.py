"""Split a full tensor into tensor-parallel shards and merge them back, by split kind (see mcore_layout)."""
from __future__ import annotations

import numpy as np

from .arrays import Rows, cat, dense, stack_rows
from .errors import ConvertError


class ShardingError(ConvertError):
    """A tensor that cannot be split evenly over the requested tensor-parallel size."""


def _chunk(tensor: np.ndarray | Rows, tp: int, dim: int, key: str) -> list:
    if tensor.shape[dim] % tp:
        raise ShardingError(f"{key}: dimension {dim} of shape {tuple(tensor.shape)} is not divisible by "
                            f"tensor parallel size {tp}")
    if dim == 0:  # row ranges: views (of every part, for Rows)
        n = tensor.shape[0] // tp
        return [tensor[i * n:(i + 1) * n] for i in range(tp)]
    return np.split(dense(tensor), tp, axis=dim)


def split(tensor: np.ndarray, kind: str, tp: int, key: str) -> list[np.ndarray]:
    """Shards for TP ranks 0..tp-1."""
    if kind == "replicated" or tp == 1:
        return [tensor] * tp
    if kind in ("column", "vocab"):
        return _chunk(tensor, tp, 0, key)
    if kind == "row":
        return _chunk(tensor, tp, 1, key)
    if kind == "gate_up":
        gate, up = _chunk(tensor, 2, 0, key)
        return [stack_rows(list(pair)) for pair in zip(_chunk(gate, tp, 0, key), _chunk(up, tp, 0, key))]
    raise ValueError(f"unknown split kind {kind!r}")


def merge(shards: list[np.ndarray], kind: str, key: str) -> np.ndarray:
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
