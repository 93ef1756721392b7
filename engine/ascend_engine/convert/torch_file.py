"""Stream ``torch.save`` files in and out one tensor at a time.

A Megatron rank file (``model_optim_rng.pt``) holds a whole pipeline stage, so ``torch.load`` / ``torch.save``
would hold it all in memory. The file is a zip archive: ``data.pkl`` (the pickled object, whose tensors refer
to storages by key) plus one ``data/<key>`` record per storage. Here tensors are written as records the moment
they are produced and ``data.pkl`` is written last; reading unpickles ``data.pkl`` into ``LazyTensor``
placeholders that read their record only when asked. The files are ordinary ``torch.load``-able checkpoints.
"""
from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import sys
import zipfile
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .errors import ConvertError


class CheckpointFileError(ConvertError):
    """A torch checkpoint file that cannot be read."""


def _storage_type(dtype: torch.dtype):
    """The legacy typed-storage class (``torch.FloatStorage``...) that torch.load uses to learn the dtype."""
    return getattr(torch, torch.storage._dtype_to_storage_type_map()[dtype])


# "FloatStorage" -> torch.float32: what a pickled storage class means, without touching deprecated classes.
_STORAGE_DTYPES = {name: dtype for dtype, name in torch.storage._dtype_to_storage_type_map().items()}


@dataclass
class _StorageRef:
    key: str
    dtype: torch.dtype
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
        return (torch._utils._rebuild_tensor_v2,
                (self.storage, 0, torch.Size(self.shape), tuple(reversed(stride)), False, collections.OrderedDict()))


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, _StorageRef):
            return ("storage", _storage_type(obj.dtype), obj.key, "cpu", obj.numel)
        return None


class StreamingTorchWriter:
    """``add(tensor)`` writes the data now and returns a placeholder to put in the object;
    ``close(obj)`` pickles the object (with placeholders) as ``data.pkl``.

    torch's zip writer would checksum every record inline, holding the GIL: that costs as much as the write
    itself. Here it writes without checksums, the CRC-32 of each tensor is computed on a thread (zlib releases
    the GIL) while the next one is written, and ``close`` patches the CRCs into the finished archive, so the
    file is the ordinary, fully checksummed zip that ``torch.save`` writes.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._zip = torch._C.PyTorchFileWriter(str(self.path), False)
        self._next = 0
        self._crcs: dict[str, Future] = {}
        self.bytes_written = 0

    def add(self, tensor: torch.Tensor) -> _SavedTensor:
        tensor = tensor.detach().to("cpu").contiguous()
        key = str(self._next)
        self._next += 1
        nbytes = tensor.numel() * tensor.element_size()
        # A slice of the storage shares its memory: a TP chunk of a bigger tensor is written without a copy.
        start = tensor.storage_offset() * tensor.element_size()
        self._zip.write_record(f"data/{key}", tensor.untyped_storage()[start:start + nbytes], nbytes)
        self._crcs[f"data/{key}"] = _checksums().submit(_crc32, tensor)
        self.bytes_written += nbytes
        return _SavedTensor(_StorageRef(key, tensor.dtype, tensor.numel()), tuple(tensor.shape))

    def close(self, obj: Any) -> None:
        buf = io.BytesIO()
        _Pickler(buf, protocol=2).dump(obj)
        data = buf.getvalue()
        self._zip.write_record("data.pkl", data, len(data))
        self._zip.write_record(".format_version", "1", 1)
        self._zip.write_record("byteorder", sys.byteorder, len(sys.byteorder))
        self._zip.write_end_of_file()
        self._zip = None
        _patch_crcs(self.path, {name: future.result() for name, future in self._crcs.items()})
        self._crcs.clear()


def _crc32(tensor: torch.Tensor) -> int:
    return zlib.crc32(tensor.view(torch.uint8).reshape(-1).numpy()) if tensor.numel() else 0


_POOL: ThreadPoolExecutor | None = None


def _checksums() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1)), thread_name_prefix="crc32")
    return _POOL


_LOCAL_HEADER, _CENTRAL_HEADER = b"PK\x03\x04", b"PK\x01\x02"


def _patch_crcs(path: Path, known: dict[str, int]) -> None:
    """Write the CRC-32 of every record into its local header and its central directory entry. ``known`` holds
    the tensors' CRCs by record name (without the archive's folder); the few small records torch adds itself
    (``data.pkl``, ``version``, ``.data/serialization_id``...) are read back and checksummed here."""
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
        central = archive.start_dir
    with path.open("r+b") as f:
        crcs = []
        for info in infos:
            name = info.filename.split("/", 1)[1] if "/" in info.filename else info.filename
            if name in known:
                crcs.append(known[name])
                continue
            f.seek(info.header_offset + 26)
            name_len, extra_len = struct.unpack("<HH", f.read(4))
            f.seek(info.header_offset + 30 + name_len + extra_len)
            crcs.append(zlib.crc32(f.read(info.file_size)))
        for info, crc in zip(infos, crcs):
            f.seek(info.header_offset)
            if f.read(4) != _LOCAL_HEADER:
                raise CheckpointFileError(f"{path}: no local header for {info.filename} at {info.header_offset}")
            f.seek(info.header_offset + 14)
            f.write(struct.pack("<I", crc))
        f.seek(central)
        directory = bytearray(f.read())
        at = 0
        for crc in crcs:
            if directory[at:at + 4] != _CENTRAL_HEADER:
                raise CheckpointFileError(f"{path}: malformed central directory at {central + at}")
            struct.pack_into("<I", directory, at + 16, crc)
            name_len, extra_len, comment_len = struct.unpack_from("<HHH", directory, at + 28)
            at += 46 + name_len + extra_len + comment_len
        f.seek(central)
        f.write(directory)


class LazyTensor:
    """A tensor in a checkpoint file, read on ``load()``; ``meta()`` gives its shape and dtype for free."""

    def __init__(self, reader: "LazyTorchFile", storage: _StorageRef, offset: int, size, stride):
        self.reader, self.storage, self.offset = reader, storage, offset
        self.shape, self.stride = tuple(size), tuple(stride)
        self.dtype = storage.dtype

    def meta(self) -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.dtype, device="meta")

    @property
    def contiguous(self) -> bool:
        return self.offset == 0 and self.stride == tuple(torch.empty(self.shape, device="meta").stride())

    def load(self) -> torch.Tensor:
        out = torch.empty(self.shape, dtype=self.dtype)
        if self.contiguous and out.numel() == self.storage.numel:
            self.read_into(out)
            return out
        flat = torch.empty(self.storage.numel, dtype=self.dtype)
        self.read_into(flat)
        return flat.as_strided(self.shape, self.stride, self.offset).clone()

    def read_into(self, out: torch.Tensor) -> None:
        """Fill a contiguous tensor with this record's bytes, straight from the file (no intermediate copy)."""
        self.reader.read_record(self.storage.key, out.view(torch.uint8).reshape(-1).numpy() if out.numel() else None,
                                self.storage.numel * torch._utils._element_size(self.dtype))


class LazyTorchFile:
    """Unpickle a torch zip checkpoint without reading tensor data."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._zip = zipfile.ZipFile(self.path)
            names = self._zip.namelist()
        except (OSError, zipfile.BadZipFile) as e:
            raise CheckpointFileError(f"{self.path}: not a readable torch checkpoint ({e})") from e
        pkl = [n for n in names if n.endswith("data.pkl")]
        if len(pkl) != 1:
            raise CheckpointFileError(f"{self.path}: no data.pkl record (not a torch zip checkpoint)")
        self._prefix = pkl[0][: -len("data.pkl")]
        self._names = set(names)
        reader = self

        class _Unpickler(pickle.Unpickler):
            def find_class(self, module, name):
                if module == "torch._utils" and name == "_rebuild_tensor_v2":
                    return lambda storage, offset, size, stride, *rest: LazyTensor(reader, storage, offset, size,
                                                                                   stride)
                if module in ("torch", "torch.storage") and name in _STORAGE_DTYPES:
                    return _STORAGE_DTYPES[name]
                return super().find_class(module, name)

            def persistent_load(self, pid):
                _, storage_type, key, _location, numel = pid
                dtype = storage_type if isinstance(storage_type, torch.dtype) else torch.uint8  # UntypedStorage
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
