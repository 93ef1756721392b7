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
import pickle
import sys
import zipfile
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
    ``close(obj)`` pickles the object (with placeholders) as ``data.pkl``."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._zip = torch._C.PyTorchFileWriter(str(self.path))
        self._next = 0
        self.bytes_written = 0

    def add(self, tensor: torch.Tensor) -> _SavedTensor:
        tensor = tensor.detach().to("cpu").contiguous()
        key = str(self._next)
        self._next += 1
        storage = tensor.untyped_storage()
        if tensor.storage_offset() or storage.nbytes() != tensor.numel() * tensor.element_size():
            tensor = tensor.clone()  # a view of a bigger buffer: write only its own bytes
            storage = tensor.untyped_storage()
        self._zip.write_record(f"data/{key}", storage, storage.nbytes())
        self.bytes_written += storage.nbytes()
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


class LazyTensor:
    """A tensor in a checkpoint file, read on ``load()``; ``meta()`` gives its shape and dtype for free."""

    def __init__(self, reader: "LazyTorchFile", storage: _StorageRef, offset: int, size, stride):
        self.reader, self.storage, self.offset = reader, storage, offset
        self.shape, self.stride = tuple(size), tuple(stride)
        self.dtype = storage.dtype

    def meta(self) -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.dtype, device="meta")

    def load(self) -> torch.Tensor:
        raw = self.reader.record(self.storage.key)
        expected = self.storage.numel * torch._utils._element_size(self.dtype)
        if len(raw) != expected:
            raise CheckpointFileError(f"{self.reader.path}: record data/{self.storage.key} has {len(raw)} bytes, "
                                      f"expected {expected}")
        flat = torch.frombuffer(raw, dtype=self.dtype) if raw else torch.empty(0, dtype=self.dtype)
        return flat.as_strided(self.shape, self.stride, self.offset).clone()


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

    def record(self, key: str) -> bytearray:
        name = f"{self._prefix}data/{key}"
        if name not in self._names:
            raise CheckpointFileError(f"{self.path}: missing record {name}")
        try:
            return bytearray(self._zip.read(name))
        except (zipfile.BadZipFile, OSError) as e:
            raise CheckpointFileError(f"{self.path}: corrupt record {name} ({e})") from e
