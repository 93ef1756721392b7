"""A bring-your-own torchrun program on the local cluster: its Megatron-style log lines reach status.progress while
it prints them, a killed worker restarts the gang and the program resumes from its own checkpoint, and a program
that fails puts its own error message in the Failed condition."""
from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from ascend_cluster.cluster import LocalCluster

from workspace import create_workspace, quickstart_job  # noqa: E402

pytestmark = pytest.mark.e2e

TRAINER = Path(__file__).resolve().parent / "megatron_style_trainer.py"
TRAIN_ITERS = 20


def byo_job(name: str, data_path: str, nnodes: int = 2) -> dict:
    return {
        "apiVersion": "ascendtrain.dev/v1alpha1", "kind": "AscendTrainJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "image": "my-team/megatron:24.09", "nnodes": nnodes, "nprocPerNode": 1,
            "devices": {"resource": "none"}, "shmSize": "none",
            "volumes": [{"name": "workspace", "persistentVolumeClaim": {"claimName": "ascend-workspace"}}],
            "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"}],
            "runPolicy": {"backoffLimit": 1},
            "trainer": {"command": ["torchrun", str(TRAINER)],
                        "args": ["--data-path", data_path, "--save", f"/workspace/checkpoints/{name}",
                                 "--train-iters", str(TRAIN_ITERS), "--save-interval", "5", "--seq-length", "64"]},
        },
    }


def test_byo_trainer_progress_restart_and_own_failure_cause(tmp_path):
    seen: list[tuple[int, float]] = []
    with LocalCluster(fast_storage=True, root=tmp_path / "cluster", operator=True) as cluster:
        create_workspace(cluster)
        resources = cluster.client()
        atj = resources.resolve("atj")
        data = cluster.root / "pvc" / "default" / "ascend-workspace" / "data"
        data.mkdir(parents=True)
        (data / "corpus").write_text("tokens")
        resources.apply(byo_job("byo", "/workspace/data/corpus"))
        resources.apply(byo_job("broken", "/workspace/data/missing", nnodes=1))

        def status(name):
            current = resources.get(atj, name, "default").get("status") or {}
            progress = current.get("progress") or {}
            if name == "byo" and current.get("phase") == "Running" and progress.get("loss") is not None:
                seen.append((progress["iteration"], progress["loss"]))
            return current

        deadline = time.monotonic() + 240
        while (status("byo").get("progress") or {}).get("lastCheckpointIteration", 0) < 5:
            assert time.monotonic() < deadline, f"no checkpoint at 5 yet: {status('byo')}"
            time.sleep(0.3)
        saved_before_kill = status("byo")["progress"]["lastCheckpointIteration"]
        cluster.runner.kill("default", "byo-1-0", signal.SIGKILL)
        while status("byo").get("phase") not in ("Succeeded", "Failed") or \
                status("broken").get("phase") not in ("Succeeded", "Failed"):
            assert time.monotonic() < deadline, f"did not finish: {status('byo')} {status('broken')}"
            time.sleep(0.3)
        final, broken = status("byo"), status("broken")
        log = (cluster.root / "pods" / "default" / "byo-0-1" / "container.log").read_text()  # the second attempt
        resources.close()
    # Live, before and after the restart: the program's own iterations and losses (10 / iteration, all-reduced).
    assert seen and all(abs(loss - 10.0 / it) < 1e-3 * loss for it, loss in seen), seen
    assert final["phase"] == "Succeeded", final
    assert final["restarts"] == 1
    progress = final["progress"]
    assert progress["iteration"] == progress["trainIters"] == TRAIN_ITERS
    assert progress["loss"] == pytest.approx(10.0 / TRAIN_ITERS, rel=1e-4)
    assert progress["tokensPerSecond"] > 0 and progress["lastCheckpointIteration"] == TRAIN_ITERS
    resumed = [line for line in log.splitlines() if "successfully loaded checkpoint" in line]
    assert len(resumed) == 1 and int(resumed[0].rsplit(" ", 1)[1]) >= saved_before_kill, log[-2000:]
    failed = next(c for c in broken["conditions"] if c["type"] == "Failed")
    assert broken["phase"] == "Failed"
    # (the local runner's path translation shows the host directory behind /workspace)
    assert re.search(r"FileNotFoundError: no dataset at \S*/data/missing_text_document\.bin", failed["message"]), failed
