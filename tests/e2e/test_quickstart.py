"""The whole path on the embedded local cluster: apply the quickstart, the operator makes pods, the runner
starts torchrun in each, rank 0's metrics reach status.progress, and the job ends Succeeded with a checkpoint."""
from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import yaml

from ascend_operator.local.cluster import LocalCluster

pytestmark = pytest.mark.e2e

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"


def test_quickstart_runs_to_success_with_live_progress(tmp_path):
    job = yaml.safe_load(QUICKSTART.read_text())
    train_iters = job["spec"]["train"]["training"]["trainIters"]
    seen_running_progress = []
    with LocalCluster(root=tmp_path / "cluster", operator=True) as cluster:
        resources = cluster.client()
        atj = resources.resolve("atj")
        resources.apply(job)
        deadline = time.monotonic() + 480
        status = {}
        while time.monotonic() < deadline:
            status = resources.get(atj, "quickstart", "default").get("status") or {}
            if status.get("phase") == "Running" and status.get("progress", {}).get("iteration"):
                seen_running_progress.append(status["progress"]["iteration"])
            if status.get("phase") in ("Succeeded", "Failed"):
                break
            time.sleep(0.5)
        log = cluster.operator_log.read_text()[-3000:]
        pods = {p["metadata"]["name"]: p for p in resources.list(resources.resolve("pods"), "default")}
        resources.close()
    assert status.get("phase") == "Succeeded", f"status: {status}\noperator log tail:\n{log}"
    assert set(pods) == {"quickstart-0", "quickstart-1"}
    # Progress was read live from rank 0 while training ran, and the final figures came with the exit.
    assert seen_running_progress, "no live progress while Running"
    progress = status["progress"]
    assert progress["iteration"] == train_iters == progress["trainIters"]
    assert math.isfinite(progress["loss"]) and progress["loss"] < 5.0
    assert progress["tokensPerSecond"] > 0
    # kubectl's LOSS and TOK/S columns: the same figures for humans, written by the operator next to the raw ones.
    assert progress["columns"] == {"loss": f"{progress['loss']:#.4g}",
                                   "tokensPerSecond": str(round(progress["tokensPerSecond"]))}
    assert status["replicas"]["succeeded"] == 2
    # The checkpoint is in Megatron's layout, on the claim's directory, one shard per TP rank.
    ckpt = tmp_path / "cluster" / "pvc" / "default" / "ascend-workspace" / "checkpoints" / "quickstart"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == str(train_iters)
    for rank in (0, 1):
        assert (ckpt / f"iter_{train_iters:07d}" / f"mp_rank_{rank:02d}" / "model_optim_rng.pt").stat().st_size > 0
