"""Megatron checkpoint layout, atomic saves and manifests: a crash while saving never damages the last good
checkpoint, and damage after saving is found (named file, what is wrong) before anything is loaded."""
from __future__ import annotations

import pytest
import torch

from ascend_engine.checkpoint import save as save_module
from ascend_engine.checkpoint.layout import MODEL_FILE, checkpoint_dir, checkpoint_file, read_latest, write_latest
from ascend_engine.checkpoint.manifest import CorruptCheckpoint, read_manifest, read_verified
from ascend_engine.checkpoint.save import begin_checkpoint, serialize


def save(root, iteration, state, background=False, keep_last=None):
    files = {MODEL_FILE: serialize({**state, "iteration": iteration})}
    return begin_checkpoint(root, iteration, "mp_rank_00", files, is_rank0=True, background=background,
                            keep_last=keep_last).finish()


def test_layout_names_follow_megatron(tmp_path):
    assert checkpoint_dir(tmp_path, 100, 1, 0, 1) == tmp_path / "iter_0000100" / "mp_rank_01"
    assert checkpoint_dir(tmp_path, 7, 0, 3, 4) == tmp_path / "iter_0000007" / "mp_rank_00_003"
    assert checkpoint_file(tmp_path, "release", 0, 0, 1) == tmp_path / "release" / "mp_rank_00" / "model_optim_rng.pt"
    assert read_latest(tmp_path) is None
    write_latest(tmp_path, 12)
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "12\n" and read_latest(tmp_path) == 12
    write_latest(tmp_path, "release")
    assert read_latest(tmp_path) == "release"
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("twelve")
    with pytest.raises(ValueError, match="latest_checkpointed_iteration.txt: expected an iteration"):
        read_latest(tmp_path)


def test_crash_during_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    save(tmp_path, 5, {"model": {"w": torch.ones(3)}})

    def crash(data, path):
        path.with_name("." + path.name + ".tmp").write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(save_module, "write_file", crash)
    with pytest.raises(OSError, match="disk full"):
        save(tmp_path, 10, {"model": {"w": torch.zeros(3)}}, background=True)
    monkeypatch.undo()

    assert read_latest(tmp_path) == 5
    assert not (tmp_path / "iter_0000010").exists()
    state = torch.load(checkpoint_file(tmp_path, 5, 0, 0, 1), weights_only=False)
    assert state["iteration"] == 5
    torch.testing.assert_close(state["model"]["w"], torch.ones(3))

    # The next save replaces the stale staging folder; re-saving an iteration swaps it in whole.
    save(tmp_path, 10, {"model": {"w": torch.zeros(3)}})
    save(tmp_path, 10, {"model": {"w": torch.full((3,), 2.0)}})
    assert read_latest(tmp_path) == 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000005", "iter_0000010",
                                                          "latest_checkpointed_iteration.txt"]
    torch.testing.assert_close(torch.load(checkpoint_file(tmp_path, 10, 0, 0, 1))["model"]["w"], torch.full((3,), 2.0))


def test_background_save_is_a_snapshot_and_keeps_the_last_n(tmp_path):
    w = torch.zeros(1000)
    pending = begin_checkpoint(tmp_path, 1, "mp_rank_00", {MODEL_FILE: serialize({"model": {"w": w}})},
                               is_rank0=True, background=True, keep_last=2)
    w += 1  # training goes on while the file is written
    assert read_latest(tmp_path) is None  # not latest before it is finished
    pending.finish()
    assert read_latest(tmp_path) == 1
    assert torch.equal(torch.load(checkpoint_file(tmp_path, 1, 0, 0, 1))["model"]["w"], torch.zeros(1000))
    for iteration in (2, 3, 4):
        save(tmp_path, iteration, {"model": {"w": w}}, background=True, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000003", "iter_0000004",
                                                          "latest_checkpointed_iteration.txt"]


def test_manifest_names_the_damaged_file_and_what_is_wrong(tmp_path):
    folder = save(tmp_path, 7, {"model": {"w": torch.arange(100.0)}})
    entries = read_manifest(folder)
    assert list(entries) == ["mp_rank_00/model_optim_rng.pt"] and (folder / "manifest.json").is_file()
    good = read_verified(folder, "mp_rank_00/model_optim_rng.pt", entries)
    path = folder / "mp_rank_00" / MODEL_FILE

    path.write_bytes(good[:-10])
    with pytest.raises(CorruptCheckpoint, match=r"model_optim_rng.pt: truncated: \d+ bytes, the manifest says"):
        read_verified(folder, "mp_rank_00/model_optim_rng.pt", entries)
    path.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])
    with pytest.raises(CorruptCheckpoint, match="model_optim_rng.pt: checksum mismatch"):
        read_verified(folder, "mp_rank_00/model_optim_rng.pt", entries)
    path.unlink()
    with pytest.raises(CorruptCheckpoint, match="model_optim_rng.pt: missing"):
        read_verified(folder, "mp_rank_00/model_optim_rng.pt", entries)
    (folder / "manifest.json").write_text('{"files": ')
    with pytest.raises(CorruptCheckpoint, match="manifest.json: unreadable manifest"):
        read_manifest(folder)
