"""A rank killed while it writes a checkpoint: the previous checkpoint stays the latest and loads, and a new run
resumes from it. Rank 1 SIGKILLs itself half-way through writing its shard of iteration 8 (a real process death
under torchrun, at a chosen moment instead of a racing timer)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_train_torchrun import TINY, VENV_BIN, assert_ok, free_port, run_train

pytestmark = pytest.mark.engine

DIE_WHILE_SAVING = '''
import os, signal, sys
from ascend_engine.checkpoint import save

real = save.write_file

def dying(data, path):
    if os.environ["RANK"] == "1" and "iter_0000008" in str(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name("." + path.name + ".tmp"), "wb") as f:
            f.write(b"half a shard")
            f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return real(data, path)

save.write_file = dying
from ascend_engine.cli import main
sys.exit(main())
'''


def test_killed_rank_during_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    import torch

    ckpt = tmp_path / "ckpt"
    config = {**TINY, "training": {**TINY["training"], "trainIters": 8},
              "parallel": {"tensorModelParallelSize": 2},
              "checkpoint": {"save": str(ckpt), "load": str(ckpt), "saveInterval": 4}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "die_while_saving.py").write_text(DIE_WHILE_SAVING)
    cmd = [str(VENV_BIN / "torchrun"), "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
           str(free_port()), str(tmp_path / "die_while_saving.py"), "train", "--config", str(tmp_path / "job.yaml")]
    died = subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    assert died.returncode != 0, died.stdout[-2000:]
    assert "Signals.SIGKILL" in died.stderr or "-9" in died.stderr, died.stderr[-3000:]

    # It died mid-write: its half shard is on disk, in the staging area only.
    halves = [p for p in ckpt.rglob("*") if p.is_file() and p.read_bytes() == b"half a shard"]
    assert halves and all(".tmp" in str(p.relative_to(ckpt)) for p in halves), halves
    # Iteration 4 is still the latest, whole on both TP ranks; nothing of iteration 8 looks complete.
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    assert not (ckpt / "iter_0000008").exists()
    for rank in (0, 1):
        state = torch.load(ckpt / "iter_0000004" / f"mp_rank_{rank:02d}" / "model_optim_rng.pt", weights_only=False)
        assert state["iteration"] == 4 and state["model"]

    # A new run (what a gang restart does) resumes at iteration 4 and finishes.
    resumed, steps = run_train(tmp_path, config, name="again.yaml")
    assert_ok(resumed)
    assert "at iteration 4" in resumed.stdout
    assert [s[0] for s in steps] == [5, 6, 7, 8]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "8"
