"""Megatron checkpoint layout and atomic saves: a crash while saving never damages the last good checkpoint."""
from __future__ import annotations

import pytest
import torch

from ascend_engine.checkpoint import save as save_module
from ascend_engine.checkpoint.layout import checkpoint_dir, checkpoint_file, read_latest, write_latest
from ascend_engine.checkpoint.save import save_checkpoint


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
    save_checkpoint(tmp_path, 5, {"model": {"w": torch.ones(3)}}, 0, 0, 1, is_rank0=True)

    def crash(obj, path):
        path.with_name("." + path.name + ".tmp").write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(save_module, "atomic_torch_save", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 10, {"model": {"w": torch.zeros(3)}}, 0, 0, 1, is_rank0=True)
    monkeypatch.undo()

    assert read_latest(tmp_path) == 5
    assert not (tmp_path / "iter_0000010").exists()
    state = torch.load(checkpoint_file(tmp_path, 5, 0, 0, 1), weights_only=False)
    assert state["iteration"] == 5 and state["checkpoint_version"] == 3.0
    torch.testing.assert_close(state["model"]["w"], torch.ones(3))

    # The next save replaces the stale staging folder; re-saving an iteration swaps it in whole.
    save_checkpoint(tmp_path, 10, {"model": {"w": torch.zeros(3)}}, 0, 0, 1, is_rank0=True)
    save_checkpoint(tmp_path, 10, {"model": {"w": torch.full((3,), 2.0)}}, 0, 0, 1, is_rank0=True)
    assert read_latest(tmp_path) == 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000005", "iter_0000010",
                                                          "latest_checkpointed_iteration.txt"]
    torch.testing.assert_close(torch.load(checkpoint_file(tmp_path, 10, 0, 0, 1))["model"]["w"], torch.full((3,), 2.0))
