"""Read and write HF safetensors checkpoints one tensor at a time.

Reading parses each shard's header and maps a tensor's bytes when asked (one map per tensor, so the
resident set stays one tensor large). Writing takes a plan (names, dtypes, shapes, in the order the
tensors will come), writes each shard's header first, then the tensors as they arrive.
"""
from __future__ import annotations

import json
import math
import mmap
import os
import struct
from pathlib import Path

import numpy as np

from .arrays import FileMap, meta, raw
from .dtypes import BY_SAFETENSORS, describe
from .errors import ConvertError, reason

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class SafetensorsError(ConvertError):
    """Missing or corrupt shards."""


class _Entry:
    def __init__(self, path: Path, start: int, end: int, dtype: np.dtype, shape: tuple[int, ...]):
        self.path, self.start, self.end, self.dtype, self.shape = path, start, end, dtype, shape


def _read_header(path: Path) -> dict[str, _Entry]:
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8 or n > 100_000_000:
                raise SafetensorsError(f"{path}: corrupt safetensors header (length {n}, file {size} bytes)")
            header = json.loads(f.read(n))
    except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SafetensorsError(f"{path}: cannot read safetensors header ({reason(e)})") from e
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = BY_SAFETENSORS[info["dtype"]].numpy
            start, end = info["data_offsets"]
            shape = tuple(info["shape"])
        except (KeyError, TypeError, ValueError) as e:
            raise SafetensorsError(f"{path}: bad header entry for {name} ({e})") from e
        numel = 1
        for d in shape:
            numel *= d
        if end - start != numel * dtype.itemsize or 8 + n + end > size:
            raise SafetensorsError(f"{path}: {name} needs bytes {start}..{end} of the data section but the file "
                                   f"is truncated or the header is inconsistent")
        entries[name] = _Entry(path, 8 + n + start, 8 + n + end, dtype, shape)
    return entries


class SafetensorsReader:
    """All tensors of an HF model directory (index + shards, or a single model.safetensors)."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        index = self.directory / INDEX_FILE
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (OSError, json.JSONDecodeError, KeyError) as e:
                raise SafetensorsError(f"{index}: cannot read the shard index ({reason(e)})") from e
            files = sorted(set(weight_map.values()))
        elif (self.directory / SINGLE_FILE).is_file():
            weight_map, files = None, [SINGLE_FILE]
        else:
            raise SafetensorsError(f"{self.directory}: no {INDEX_FILE} or {SINGLE_FILE}")
        self.entries: dict[str, _Entry] = {}
        for name in files:
            path = self.directory / name
            if not path.is_file():
                raise SafetensorsError(f"{index}: shard {name} is missing")
            self.entries.update(_read_header(path))
        if weight_map is not None:
            missing = sorted(n for n in weight_map if n not in self.entries)
            if missing:
                raise SafetensorsError(f"{index}: {len(missing)} tensors listed but not in their shards, "
                                       f"e.g. {missing[0]}")

    def names(self) -> list[str]:
        return list(self.entries)

    def meta(self, name: str) -> np.ndarray:
        e = self._entry(name)
        return meta(e.shape, e.dtype)

    def load(self, name: str) -> np.ndarray:
        """The tensor, read-only, over a memory map of just its bytes (a ``FileMap``: the writers copy the
        untouched ones file to file); pages come from the page cache as they are touched and are unmapped when
        the array is dropped. (MAP_POPULATE, mapping them all up front, measured 3-5x more system time.)"""
        e = self._entry(name)
        nbytes = e.end - e.start
        if not nbytes:
            return np.empty(e.shape, dtype=e.dtype)
        start = e.start - e.start % mmap.ALLOCATIONGRANULARITY
        try:
            with e.path.open("rb") as f:
                if os.fstat(f.fileno()).st_size < e.end:
                    raise SafetensorsError(f"{e.path}: truncated while reading {name}")
                view = FileMap(f.fileno(), e.end - start, mmap.MAP_SHARED, mmap.PROT_READ,
                               offset=start).locate(str(e.path), start)
        except OSError as err:
            raise SafetensorsError(f"{e.path}: cannot read {name} ({reason(err)})") from err
        return np.frombuffer(view, dtype=e.dtype, count=nbytes // e.dtype.itemsize,
                             offset=e.start - start).reshape(e.shape)

    def _entry(self, name: str) -> _Entry:
        try:
            return self.entries[name]
        except KeyError:
            raise SafetensorsError(f"{self.directory}: tensor {name} is missing") from None


def _nbytes(dtype: np.dtype, shape: tuple[int, ...]) -> int:
    return dtype.itemsize * math.prod(shape)


def plan_shards(plan: list[tuple[str, np.dtype, tuple[int, ...]]], max_bytes: int) -> list[list[int]]:
    """Group plan entries (kept in order) into shards of at most ``max_bytes`` (a bigger tensor gets its own)."""
    shards: list[list[int]] = [[]]
    size = 0
    for i, (_, dtype, shape) in enumerate(plan):
        nbytes = _nbytes(dtype, shape)
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(i)
        size += nbytes
    return shards


class SafetensorsWriter:
    """Write planned tensors into shards plus ``model.safetensors.index.json`` under ``directory``."""

    def __init__(self, directory: Path, plan: list[tuple[str, np.dtype, tuple[int, ...]]], max_bytes: int):
        self.directory, self.plan = directory, plan
        self.groups = plan_shards(plan, max_bytes)
        n = len(self.groups)
        self.files = [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)]
        self._shard_of = {i: k for k, group in enumerate(self.groups) for i in group}
        self._next = 0
        self._f = None

    def _open(self, k: int) -> None:
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for i in self.groups[k]:
            name, dtype, shape = self.plan[i]
            nbytes = _nbytes(dtype, shape)
            header[name] = {"dtype": describe(dtype).safetensors, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned, as safetensors writes it
        self._f = (self.directory / self.files[k]).open("wb")
        self._f.write(struct.pack("<Q", len(raw)) + raw)

    def add(self, name: str, tensor: np.ndarray) -> None:
        i = self._next
        expect = self.plan[i] if i < len(self.plan) else None
        if expect is None or expect[0] != name or expect[1] != tensor.dtype or tuple(tensor.shape) != expect[2]:
            raise RuntimeError(f"safetensors writer: got {name} {tensor.dtype} {tuple(tensor.shape)}, planned {expect}")
        k = self._shard_of[i]
        if i == self.groups[k][0]:
            self._close_file()
            self._open(k)
        self._f.write(raw(tensor))
        self._next += 1

    def _close_file(self) -> None:
        if self._f is not None:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            self._f = None

    def close(self) -> None:
        if self._next != len(self.plan):
            raise RuntimeError(f"safetensors writer: {self._next} of {len(self.plan)} planned tensors written")
        self._close_file()
        total = sum(_nbytes(dtype, shape) for _, dtype, shape in self.plan)
        index = {"metadata": {"total_size": total},
                 "weight_map": {name: self.files[self._shard_of[i]] for i, (name, _, _) in enumerate(self.plan)}}
        (self.directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
