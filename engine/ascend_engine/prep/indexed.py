"""Megatron's indexed dataset (``MMIDIDX``), written as a stream into temp files and renamed when complete.

Layout of ``.idx`` (little-endian): magic ``MMIDIDX\\0\\0``, u64 version 1, u8 dtype code, u64 sequence count,
u64 document count (documents + 1), int32 sequence lengths, int64 byte offsets into ``.bin``, int64 document
indices starting with 0. Every sequence written here is its own document, as MindSpeed-LLM writes them.

Memory stays flat: the per-sequence lengths are spooled to a temp file and the index is assembled in blocks.
"""
from __future__ import annotations

import hashlib
import os
import struct
import tempfile

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
DTYPE_CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.float64: 6, np.float32: 7,
               np.uint16: 8}
BLOCK = 1 << 20  # sequences per block when assembling the index


class HashingFile:
    """A binary file that keeps a running size and sha256 of what was written."""

    def __init__(self, path: str):
        self.path = path
        self.file = open(path, "wb")
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes | memoryview) -> None:
        self.file.write(data)
        self.sha256.update(data)
        self.size += len(data)

    def close(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()


class IndexedDatasetWriter:
    """``<prefix>.bin`` and ``<prefix>.idx``; nothing appears under the final names before ``commit``."""

    def __init__(self, prefix: str, dtype: type[np.number]):
        self.prefix, self.dtype = prefix, np.dtype(dtype)
        self.code = DTYPE_CODES[self.dtype.type]
        directory = os.path.dirname(os.path.abspath(prefix))
        os.makedirs(directory, exist_ok=True)
        tag = f".tmp-{os.getpid()}"
        self.tmp_bin, self.tmp_idx = f"{prefix}.bin{tag}", f"{prefix}.idx{tag}"
        self.bin = HashingFile(self.tmp_bin)
        self.lengths = tempfile.TemporaryFile(dir=directory)
        self.count = 0
        self.idx: HashingFile | None = None

    def add(self, data: np.ndarray, lengths: np.ndarray) -> None:
        """Append sequences: ``data`` is their tokens back to back, ``lengths`` their sizes."""
        if int(lengths.sum()) != data.size:
            raise ValueError(f"{self.prefix}: lengths sum to {int(lengths.sum())} but {data.size} tokens given")
        self.bin.write(np.ascontiguousarray(data, dtype=self.dtype).data)
        self.lengths.write(np.asarray(lengths, dtype=np.int32).tobytes())
        self.count += len(lengths)

    def finish(self) -> None:
        """Close ``.bin`` and write ``.idx`` (both still under temp names)."""
        self.bin.close()
        idx = self.idx = HashingFile(self.tmp_idx)
        idx.write(MAGIC + struct.pack("<Q", 1) + struct.pack("<B", self.code))
        idx.write(struct.pack("<Q", self.count) + struct.pack("<Q", self.count + 1))
        self.lengths.seek(0)
        for block in self._length_blocks():
            idx.write(block.tobytes())
        self.lengths.seek(0)
        offset = 0
        for block in self._length_blocks():
            pointers = np.empty(len(block), dtype=np.int64)
            pointers[0] = offset
            np.cumsum(block[:-1].astype(np.int64) * self.dtype.itemsize, out=pointers[1:])
            pointers[1:] += offset
            offset += int(block.astype(np.int64).sum()) * self.dtype.itemsize
            idx.write(pointers.tobytes())
        for start in range(0, self.count + 1, BLOCK):
            idx.write(np.arange(start, min(start + BLOCK, self.count + 1), dtype=np.int64).tobytes())
        idx.close()
        self.lengths.close()

    def _length_blocks(self):
        while True:
            raw = self.lengths.read(BLOCK * 4)
            if not raw:
                return
            yield np.frombuffer(raw, dtype=np.int32)

    def commit(self) -> dict:
        """Rename both files into place; returns their sizes and sha256 for the manifest."""
        os.replace(self.tmp_bin, f"{self.prefix}.bin")
        os.replace(self.tmp_idx, f"{self.prefix}.idx")
        return {"prefix": self.prefix, "dtype": self.dtype.name, "sequences": self.count,
                "bin": {"bytes": self.bin.size, "sha256": self.bin.sha256.hexdigest()},
                "idx": {"bytes": self.idx.size, "sha256": self.idx.sha256.hexdigest()}}

    def abort(self) -> None:
        """Drop the temp files; files under the final names (an earlier good run) are left alone."""
        for f in (self.bin.file, self.lengths):
            f.close()
        if self.idx is not None:
            self.idx.file.close()
        for path in (self.tmp_bin, self.tmp_idx):
            if os.path.exists(path):
                os.remove(path)
