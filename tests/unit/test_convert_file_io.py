"""The converter's own file writers and readers against the libraries' references: a streamed Megatron rank file
must be what ``torch.save`` writes (same records, same contents, every zip CRC right), and a tensor read from an
mmap'd safetensors shard must equal ``safetensors``' own reading and never write through to the file.
The converter works on numpy arrays (bfloat16 from ml_dtypes); torch is only the reference here."""
from __future__ import annotations

import argparse
import zipfile

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from ascend_engine.convert import torch_file
from ascend_engine.convert.safetensors_io import SafetensorsError, SafetensorsReader
from ascend_engine.convert.torch_file import LazyTorchFile, StreamingTorchWriter, torch_dtype


def as_numpy(tensor: torch.Tensor) -> np.ndarray:
    """The same elements as a numpy array (a view; bfloat16 as ml_dtypes' bfloat16)."""
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def same(array: np.ndarray, tensor: torch.Tensor) -> bool:
    expected = as_numpy(tensor.contiguous())
    return array.dtype == expected.dtype and array.shape == expected.shape and array.tobytes() == expected.tobytes()


def _state() -> dict:
    gen = torch.Generator().manual_seed(0)
    full = torch.randn(8, 6, generator=gen)
    return {
        "bf16": torch.randn(16, 4, generator=gen).to(torch.bfloat16),
        "tp_chunk": torch.chunk(full, 2, dim=0)[1],  # a view at a storage offset, as a column TP shard is
        "row_chunk": torch.chunk(full, 2, dim=1)[1],  # not contiguous, as a row TP shard is
        "int": torch.arange(5, dtype=torch.int64),
        "empty": torch.empty(0, 3),
        "half": torch.randn(3, generator=gen).half(),
    }


def _tensor_records(path) -> dict[str, int]:
    """Tensor record names (without the archive folder) and sizes."""
    with zipfile.ZipFile(path) as archive:
        return {i.filename.split("/", 1)[1]: i.file_size for i in archive.infolist() if "/data/" in i.filename}


@pytest.mark.parametrize("zip64", [False, True], ids=["zip", "zip64"])
def test_streamed_rank_file_is_what_torch_save_writes(tmp_path, monkeypatch, zip64):
    if zip64:  # every size and offset past the limit: the fields a rank file over 4 GiB carries
        monkeypatch.setattr(torch_file, "ZIP64_LIMIT", 16)
    state = _state()
    args = {"tensor_model_parallel_size": 2}
    obj = {"checkpoint_version": 3.0, "iteration": 7, "extra": None}
    ours, reference = tmp_path / "ours" / "model_optim_rng.pt", tmp_path / "ref" / "model_optim_rng.pt"
    ours.parent.mkdir()
    reference.parent.mkdir()
    writer = StreamingTorchWriter(ours)
    placeholders = {k: writer.add(as_numpy(v)) for k, v in state.items()}
    writer.close({**obj, "model": placeholders,
                  "args": argparse.Namespace(**args, params_dtype=torch_dtype(np.dtype(ml_dtypes.bfloat16)))})
    torch.save({**obj, "model": {k: v.clone() for k, v in state.items()},
                "args": argparse.Namespace(**args, params_dtype=torch.bfloat16)}, reference)

    with zipfile.ZipFile(ours) as archive:
        assert archive.testzip() is None  # every record's CRC-32 is right
    assert _tensor_records(ours) == _tensor_records(reference)
    loaded = torch.load(ours, weights_only=False)
    assert loaded["args"] == torch.load(reference, weights_only=False)["args"]
    assert loaded["args"].params_dtype is torch.bfloat16
    assert loaded["iteration"] == 7 and loaded["extra"] is None
    lazy = LazyTorchFile(ours)
    assert lazy.obj["args"].params_dtype == torch_dtype(np.dtype(ml_dtypes.bfloat16))
    for key, tensor in state.items():
        got = loaded["model"][key]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape and got.is_contiguous()
        assert torch.equal(got, tensor), key
        assert same(lazy.obj["model"][key].load(), tensor), key
        assert same(LazyTorchFile(reference).obj["model"][key].load(), tensor), key  # torch's own file, no torch


def test_mmap_safetensors_reads_equal_the_library_and_stay_private(tmp_path):
    state = {k: v.contiguous() for k, v in _state().items()}
    path = tmp_path / "model.safetensors"
    save_file(state, str(path), metadata={"format": "pt"})
    before = path.read_bytes()
    reader = SafetensorsReader(tmp_path)
    expected = load_file(str(path))
    for name, tensor in expected.items():
        got = reader.load(name)
        assert same(got, tensor), name
        if got.size:
            assert not got.flags.writeable  # a read-only mapping: nothing can write through to the checkpoint
    assert path.read_bytes() == before


def test_truncated_shard_names_the_file(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.randn(64, 64)}, str(path))
    reader = SafetensorsReader(tmp_path)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 100)
    with pytest.raises(SafetensorsError, match="model.safetensors: truncated while reading w"):
        reader.load("w")
