"""Stream ``torch.save`` files in and out one tensor at a time, without importing torch.

A Megatron rank file (``model_optim_rng.pt``) holds a whole pipeline stage, so ``torch.load`` / ``torch.save``
would hold it all in memory, and importing torch alone costs more CPU than copying a gigabyte. The file is a zip
archive: ``data.pkl`` (the pickled object, whose tensors refer to storages by key) plus one ``data/<key>``
record per storage, each record's data 64-byte aligned as torch writes it. Here the records are written the
moment the tensors are produced (by a thread pool, each at an offset reserved up front, CRC-32 computed on the
same thread: zlib and the write release the GIL) and ``data.pkl`` is pickled last, naming torch's classes by
name (``TorchGlobal``). Reading unpickles ``data.pkl`` into ``LazyTensor`` placeholders that read their record
only when asked. The files are ordinary, fully checksummed ``torch.load``-able checkpoints (zip64 when a record
or the file passes 4 GiB).
"""
from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import sys
import threading
import zipfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from zlib_ng import zlib_ng  # zlib's CRC-32, 8-10x faster (SIMD): at zlib's speed the checksums cost more than the copy

from .arrays import Rows, file_range, meta, nbytes, raw
from .dtypes import BY_STORAGE, BY_TORCH, describe
from .errors import ConvertError, reason

ALIGNMENT = 64  # torch's record alignment (what ``torch.load(mmap=True)`` relies on)
ZIP64_LIMIT = 0xFFFFFFFF  # sizes and offsets from here on need zip64 fields
_IN_ZIP64 = 0xFFFFFFFF  # what the 32-bit field then says


def _field(value: int) -> int:
    return _IN_ZIP64 if value >= ZIP64_LIMIT else value
IN_FLIGHT_BYTES = 128 << 20  # tensor bytes queued for writing, over all writers (bounds the peak memory)


class CheckpointFileError(ConvertError):
    """A torch checkpoint file that cannot be read."""


@dataclass(frozen=True)
class TorchGlobal:
    """A torch object known by its name only (``torch.bfloat16``, ``torch.BFloat16Storage``): it unpickles from
    and pickles to the same global, so checkpoint ``args`` survive a conversion without torch."""
    module: str
    name: str

    def __call__(self, *args):  # pickle only checks that a reduce function is callable; nothing calls it here
        raise TypeError(f"{self.module}.{self.name} is a name only (the converter runs without torch)")


_REBUILD = TorchGlobal("torch._utils", "_rebuild_tensor_v2")


def torch_dtype(dtype: np.dtype) -> TorchGlobal:
    """What ``torch.<dtype>`` pickles as (e.g. the ``params_dtype`` in Megatron's args)."""
    return TorchGlobal("torch", describe(dtype).torch)


@dataclass
class _StorageRef:
    key: str
    dtype: np.dtype
    numel: int


class _SavedTensor:
    """Stands in for a tensor already written as a record; pickles exactly like a contiguous CPU tensor."""

    def __init__(self, storage: _StorageRef, shape: tuple[int, ...]):
        self.storage, self.shape = storage, shape

    def __reduce_ex__(self, protocol):
        stride, acc = [], 1
        for n in reversed(self.shape):
            stride.append(acc)
            acc *= n
        return (_REBUILD, (self.storage, 0, tuple(self.shape), tuple(reversed(stride)), False,
                           collections.OrderedDict()))


class _Pickler(pickle._Pickler):
    """The pure-Python pickler, taught to write ``TorchGlobal`` as the global it names."""

    dispatch = dict(pickle._Pickler.dispatch)

    def _save_torch_global(self, obj: TorchGlobal) -> None:
        self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())
        self.memoize(obj)

    dispatch[TorchGlobal] = _save_torch_global

    def persistent_id(self, obj):
        if isinstance(obj, _StorageRef):
            return ("storage", TorchGlobal("torch", describe(obj.dtype).storage), obj.key, "cpu", obj.numel)
        return None


def _local_header(name: bytes, offset: int, size: int, crc: int) -> bytes:
    """A stored entry's local header, sizes inline (zip64 past 4 GiB), padded so the data starts aligned."""
    zip64 = struct.pack("<HHQQ", 1, 16, size, size) if size >= ZIP64_LIMIT else b""
    start = offset + 30 + len(name) + len(zip64) + 4
    padding = -start % ALIGNMENT
    extra = zip64 + b"FB" + struct.pack("<H", padding) + b"Z" * padding
    return struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 45 if zip64 else 20, 0x800, 0, 0, 0x21, crc, _field(size),
                       _field(size), len(name), len(extra)) + name + extra


def _central_entry(name: bytes, offset: int, size: int, crc: int) -> bytes:
    fields = ([size, size] if size >= ZIP64_LIMIT else []) + ([offset] if offset >= ZIP64_LIMIT else [])
    extra = struct.pack(f"<HH{len(fields)}Q", 1, 8 * len(fields), *fields) if fields else b""
    version = 45 if fields else 20
    return struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", version, version, 0x800, 0, 0, 0x21, crc,
                       _field(size), _field(size), len(name), len(extra), 0, 0, 0, 0, _field(offset)) + name + extra


def _end_records(count: int, start: int, size: int) -> bytes:
    """End of central directory (with the zip64 end record and locator in front when anything is past 4 GiB)."""
    if count < 0xFFFF and start + size < ZIP64_LIMIT:
        return struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, count, count, size, start, 0)
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, _IN_ZIP64, _IN_ZIP64, 0)
    zip64_end = struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, size, start)
    locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, start + size, 1)
    return zip64_end + locator + end


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while len(data):
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


class StreamingTorchWriter:
    """``add(array)`` queues the tensor's record and returns a placeholder to put in the object;
    ``close(obj)`` waits for the records, pickles the object (with placeholders) as ``data.pkl`` and ends the
    archive. Records go to the file in parallel (each at its reserved offset), at most ``IN_FLIGHT_BYTES`` of
    them held at a time."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._folder = self.path.name.rsplit(".", 1)[0]  # torch names the archive's folder after the file
        self._end = 0
        self._tensors = 0
        self._entries: list[tuple[bytes, int, int, Future | int]] = []  # name, offset, size, crc

    def _reserve(self, record: str, size: int) -> tuple[bytes, int, int]:
        name = f"{self._folder}/{record}".encode()
        offset = self._end
        header_size = len(_local_header(name, offset, size, 0))
        self._end = offset + header_size + size
        return name, offset, header_size

    def add(self, array: np.ndarray | Rows) -> _SavedTensor:
        key = str(self._tensors)
        self._tensors += 1
        size = nbytes(array)
        name, offset, header_size = self._reserve(f"data/{key}", size)
        _IN_FLIGHT.take(size)
        future = _pool().submit(self._write_record, name, offset, header_size, array)
        future.add_done_callback(lambda _: _IN_FLIGHT.give(size))
        self._entries.append((name, offset, size, future))
        return _SavedTensor(_StorageRef(key, array.dtype, array.size), tuple(array.shape))

    def _write_record(self, name: bytes, offset: int, header_size: int, data) -> int:
        """Data first, part by part for ``Rows``, the header with the finished CRC-32 last. A part that is an
        untouched range of a source file is copied from the file through a small buffer (as ``cp`` does; mapping
        its pages in costs more); any other is made contiguous (if it is not) and written from memory."""
        parts = [data] if isinstance(data, bytes) else data.parts if isinstance(data, Rows) else [data]
        crc, at = 0, offset + header_size
        for part in parts:
            where = None if isinstance(part, bytes) else file_range(part)
            if where is not None:
                crc = self._copy_range(*where, nbytes(part), at, crc)
                at += nbytes(part)
                continue
            view = memoryview(part) if isinstance(part, bytes) else raw(part, _scratch())
            crc = zlib_ng.crc32(view, crc)
            _pwrite_all(self._fd, view, at)
            at += len(view)
            view.release()  # the scratch buffer may grow for the next part
        header = _local_header(name, offset, at - offset - header_size, crc)
        assert len(header) == header_size
        _pwrite_all(self._fd, memoryview(header), offset)
        return crc

    def _copy_range(self, path: str, start: int, size: int, at: int, crc: int) -> int:
        buffer = _copy_buffer()
        with open(path, "rb", buffering=0) as source:
            done = 0
            while done < size:
                n = os.preadv(source.fileno(), [buffer[:min(len(buffer), size - done)]], start + done)
                if n <= 0:
                    raise CheckpointFileError(f"{path}: ended at byte {start + done} while copying a tensor")
                chunk = buffer[:n]
                crc = zlib_ng.crc32(chunk, crc)
                _pwrite_all(self._fd, chunk, at + done)
                done += n
        return crc

    def _add_small(self, record: str, data: bytes) -> None:
        name, offset, header_size = self._reserve(record, len(data))
        self._entries.append((name, offset, len(data), self._write_record(name, offset, header_size, data)))

    def close(self, obj: Any) -> None:
        try:
            for entry in self._entries:
                if isinstance(entry[3], Future):
                    entry[3].result()
            buf = io.BytesIO()
            _Pickler(buf, protocol=2).dump(obj)
            self._add_small("data.pkl", buf.getvalue())
            self._add_small(".format_version", b"1")
            self._add_small(".storage_alignment", str(ALIGNMENT).encode())
            self._add_small("byteorder", sys.byteorder.encode())
            self._add_small("version", b"3\n")
            directory = b"".join(_central_entry(name, offset, size, crc if isinstance(crc, int) else crc.result())
                                 for name, offset, size, crc in self._entries)
            _pwrite_all(self._fd, memoryview(directory + _end_records(len(self._entries), self._end,
                                                                      len(directory))), self._end)
        finally:
            os.close(self._fd)


class _ByteBudget:
    """At most ``limit`` bytes taken at once (a single bigger request is let through alone)."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0
        self._cond = threading.Condition()

    def take(self, n: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.used == 0 or self.used + n <= self.limit)
            self.used += n

    def give(self, n: int) -> None:
        with self._cond:
            self.used -= n
            self._cond.notify_all()


_IN_FLIGHT = _ByteBudget(IN_FLIGHT_BYTES)
_THREAD = threading.local()


def _copy_buffer() -> memoryview:
    """This writing thread's 1 MiB for file-to-file copies (small enough to stay in the CPU's cache between
    the read, the CRC and the write: measured faster than 8 MiB or 64 MiB)."""
    if not hasattr(_THREAD, "copy"):
        _THREAD.copy = memoryview(bytearray(1 << 20))
    return _THREAD.copy


def _scratch() -> bytearray:
    """This writing thread's buffer for making non-contiguous shards contiguous."""
    if not hasattr(_THREAD, "scratch"):
        _THREAD.scratch = bytearray()
    return _THREAD.scratch
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 1)), thread_name_prefix="record")
        return _POOL


class LazyTensor:
    """A tensor in a checkpoint file, read on ``load()``; ``meta()`` gives its shape and dtype for free."""

    def __init__(self, reader: "LazyTorchFile", storage: _StorageRef, offset: int, size, stride):
        self.reader, self.storage, self.offset = reader, storage, offset
        self.shape, self.stride = tuple(size), tuple(stride)
        self.dtype = storage.dtype

    def meta(self) -> np.ndarray:
        return meta(self.shape, self.dtype)

    @property
    def contiguous(self) -> bool:
        expect, acc = [], 1
        for n in reversed(self.shape):
            expect.append(acc)
            acc *= n
        return self.offset == 0 and (self.stride == tuple(reversed(expect)) or acc <= 1)

    def load(self) -> np.ndarray:
        out = np.empty(self.shape, dtype=self.dtype)
        if self.contiguous and out.size == self.storage.numel:
            self.read_into(out)
            return out
        flat = np.empty(self.storage.numel, dtype=self.dtype)
        self.read_into(flat)
        item = flat.itemsize
        return np.lib.stride_tricks.as_strided(flat[self.offset:], self.shape,
                                               tuple(s * item for s in self.stride)).copy()

    def read_into(self, out: np.ndarray) -> None:
        """Fill a contiguous array with this record's bytes, straight from the file (no intermediate copy)."""
        self.reader.read_record(self.storage.key, out.reshape(-1).view(np.uint8) if out.size else None,
                                self.storage.numel * self.dtype.itemsize)


# Modules whose globals a checkpoint may name and that are safe and cheap to import (argparse.Namespace...).
_STDLIB_MODULES = {"builtins", "collections", "argparse", "copyreg", "_codecs", "datetime", "enum", "types",
                   "pathlib", "posixpath"}


class LazyTorchFile:
    """Unpickle a torch zip checkpoint without reading tensor data (and without torch)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._zip = zipfile.ZipFile(self.path)
            names = self._zip.namelist()
        except (OSError, zipfile.BadZipFile) as e:
            raise CheckpointFileError(f"{self.path}: not a readable torch checkpoint ({reason(e)})") from e
        pkl = [n for n in names if n.endswith("data.pkl")]
        if len(pkl) != 1:
            raise CheckpointFileError(f"{self.path}: no data.pkl record (not a torch zip checkpoint)")
        self._prefix = pkl[0][: -len("data.pkl")]
        reader = self

        class _Unpickler(pickle.Unpickler):
            def find_class(self, module, name):
                if (module, name) == (_REBUILD.module, _REBUILD.name):
                    return lambda storage, offset, size, stride, *rest: LazyTensor(reader, storage, offset, size,
                                                                                   stride)
                if module in ("torch", "torch.storage") and (name in BY_STORAGE or name == "UntypedStorage"
                                                             or name in BY_TORCH):
                    return TorchGlobal("torch", name)
                if module == "torch" and name == "Size":
                    return tuple
                return super().find_class(module, name)  # anything else (megatron's enums...) imports as usual

            def persistent_load(self, pid):
                _, storage_type, key, _location, numel = pid
                name = storage_type.name if isinstance(storage_type, TorchGlobal) else ""
                dtype = BY_STORAGE[name].numpy if name in BY_STORAGE else (
                    BY_TORCH[name].numpy if name in BY_TORCH else np.dtype(np.uint8))  # UntypedStorage: bytes
                return _StorageRef(str(key), dtype, int(numel))

        try:
            self.obj = _Unpickler(io.BytesIO(self._zip.read(pkl[0]))).load()
        except (pickle.UnpicklingError, EOFError, zipfile.BadZipFile, AttributeError, ImportError, ValueError) as e:
            raise CheckpointFileError(f"{self.path}: cannot unpickle data.pkl ({e})") from e

    def read_record(self, key: str, out, nbytes: int) -> None:
        """Read record ``data/<key>`` into the writable buffer ``out``. torch writes records uncompressed, so the
        bytes are read in place from their offset; sizes are checked, CRCs are not (that would mean a second pass)."""
        name = f"{self._prefix}data/{key}"
        try:
            info = self._zip.getinfo(name)
        except KeyError:
            raise CheckpointFileError(f"{self.path}: missing record {name}") from None
        if info.compress_type != zipfile.ZIP_STORED or info.file_size != nbytes:
            raise CheckpointFileError(f"{self.path}: record {name} has {info.file_size} bytes, expected {nbytes}")
        if not nbytes:
            return
        with self.path.open("rb") as f:
            f.seek(info.header_offset)
            local = f.read(30)
            if len(local) != 30 or local[:4] != b"PK\x03\x04":
                raise CheckpointFileError(f"{self.path}: corrupt zip entry for {name}")
            name_len, extra_len = struct.unpack("<HH", local[26:30])
            f.seek(info.header_offset + 30 + name_len + extra_len)
            if f.readinto(memoryview(out).cast("B")) != nbytes:
                raise CheckpointFileError(f"{self.path}: truncated record {name}")
