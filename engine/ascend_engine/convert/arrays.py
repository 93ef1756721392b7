"""numpy arrays as the converter's tensors, and shape-only ("meta") arrays for the dry run.

A meta array is a broadcast of one zero element: it has the shape and dtype of the real tensor, costs no memory,
and reshapes, slices and splits like it (every view stays a broadcast). Only concatenation would allocate, so
``cat`` builds the result's shape directly for meta inputs.
"""
from __future__ import annotations

import math
import mmap

import numpy as np


def meta(shape, dtype) -> np.ndarray:
    return np.broadcast_to(np.zeros((), dtype=dtype), tuple(shape))


def is_meta(array) -> bool:
    return isinstance(array, np.ndarray) and array.size > 1 and not any(array.strides)


def cat(arrays: list[np.ndarray], axis: int) -> np.ndarray:
    """``np.concatenate``; for meta inputs a meta result (shapes checked as numpy would)."""
    if not is_meta(arrays[0]):
        # numpy concatenates ml_dtypes' bfloat16 (kind "V") element by element through a cast, 10x slower
        # than moving the same bits as uint16
        dtype = arrays[0].dtype
        if dtype.kind == "V":
            bits = np.dtype(f"u{dtype.itemsize}")
            return np.concatenate([a.view(bits) for a in arrays], axis=axis).view(dtype)
        return np.concatenate(arrays, axis=axis)
    first = arrays[0].shape
    for a in arrays[1:]:
        if a.ndim != len(first) or a.shape[:axis] != first[:axis] or a.shape[axis + 1:] != first[axis + 1:]:
            raise ValueError(f"cat: shapes {first} and {a.shape} differ outside dimension {axis}")
    return meta((*first[:axis], sum(a.shape[axis] for a in arrays), *first[axis + 1:]), arrays[0].dtype)


def nbytes(array) -> int:
    return array.size * array.itemsize


def raw(array: np.ndarray, scratch: bytearray | None = None) -> memoryview:
    """The bytes of an array in C order as a flat byte view: the array's own memory when it is C-contiguous,
    else a copy, into ``scratch`` when given (grown as needed; reusing it spares the page faults of fresh
    memory for every row-parallel shard)."""
    if array.flags.c_contiguous or scratch is None:
        return memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
    size = nbytes(array)
    if len(scratch) < size:
        scratch.extend(bytes(size - len(scratch)))
    bits = np.dtype(f"u{array.itemsize}")  # plain bits: no per-element path for ml_dtypes' bfloat16
    out = np.frombuffer(scratch, dtype=bits, count=array.size).reshape(array.shape)
    np.copyto(out, array.view(bits))
    return memoryview(scratch)[:size]


class Rows:
    """Arrays stacked along dimension 0 and left where they are: a fused tensor (q/k/v groups, gate and up) made
    of row ranges of memory-mapped source tensors is written part by part, never copied into one buffer.
    Row slices and casts stay lazy; ``dense`` makes one array where a computation needs it."""

    def __init__(self, parts: list[np.ndarray]):
        self.parts = [p for p in parts if p.shape[0]] or parts[:1]
        first = parts[0]
        for p in parts[1:]:
            if p.dtype != first.dtype or p.shape[1:] != first.shape[1:]:
                raise ValueError(f"rows: cannot stack {p.dtype} {p.shape} under {first.dtype} {first.shape}")
        self.shape = (sum(p.shape[0] for p in parts), *first.shape[1:])
        self.dtype, self.ndim, self.itemsize = first.dtype, first.ndim, first.itemsize
        self.size = math.prod(self.shape)

    def __getitem__(self, rows: slice) -> "Rows":
        start, stop, step = rows.indices(self.shape[0])
        if step != 1:
            raise ValueError("rows: only contiguous row ranges")
        parts, at = [], 0
        for p in self.parts:
            lo, hi = max(start - at, 0), min(stop - at, p.shape[0])
            if lo < hi:
                parts.append(p[lo:hi])
            at += p.shape[0]
        return Rows(parts or [self.parts[0][:0]])

    def astype(self, dtype) -> "Rows":
        return Rows([p.astype(dtype) for p in self.parts])


def stack_rows(parts: list[np.ndarray]) -> np.ndarray | Rows:
    """``cat(parts, 0)`` without the copy (``Rows``); meta parts give a meta array."""
    flat = [q for p in parts for q in (p.parts if isinstance(p, Rows) else [p])]
    return cat(flat, 0) if is_meta(flat[0]) else Rows(flat)


def dense(array: np.ndarray | Rows) -> np.ndarray:
    return cat(array.parts, 0) if isinstance(array, Rows) else array


class FileMap(mmap.mmap):
    """A read-only map of a file range that remembers which range: an array viewing it can be copied file to
    file (``file_range``) without its pages ever being mapped in, which costs this kind of machine (a VM) more
    than reading them."""

    def locate(self, path: str, offset: int) -> "FileMap":
        self.path, self.offset = path, offset
        self.address = np.frombuffer(self, dtype=np.uint8, count=1).ctypes.data if len(self) else 0
        return self


def file_range(array) -> tuple[str, int] | None:
    """(path, offset) of a C-contiguous array's bytes when it is a view of a ``FileMap``, else None."""
    if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
        return None
    owner = array
    while owner is not None and not isinstance(owner, FileMap):
        owner = owner.obj if isinstance(owner, memoryview) else getattr(owner, "base", None)
    if owner is None:
        return None
    return owner.path, owner.offset + array.ctypes.data - owner.address

