"""A training pod killed mid-run on the local cluster: the job goes Restarting, the whole gang is replaced, the
restart is counted, and the engine resumes from its own last checkpoint instead of starting over."""
from __future__ import annotations

import copy
import re
import signal
import time
from pathlib import Path

import pytest
import yaml

from ascend_operator.local.cluster import LocalCluster

pytestmark = pytest.mark.e2e

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"


def test_killed_worker_restarts_the_gang_which_resumes_from_checkpoint(tmp_path):
    job = copy.deepcopy(yaml.safe_load(QUICKSTART.read_text()))
    job["metadata"]["name"] = "resume"
    train = job["spec"]["train"]
    train["training"]["trainIters"] = 200
    train["checkpoint"].update(save="/workspace/checkpoints/resume", saveInterval=10)
    train["observability"]["logInterval"] = 10
    job["spec"]["runPolicy"] = {"backoffLimit": 2}
    phases: list[str] = []
    with LocalCluster(root=tmp_path / "cluster", operator=True) as cluster:
        resources = cluster.client()
        atj = resources.resolve("atj")
        resources.apply(job)

        def status():
            s = resources.get(atj, "resume", "default").get("status") or {}
            if s.get("phase") and (not phases or phases[-1] != s["phase"]):
                phases.append(s["phase"])
            return s

        # The kill follows the checkpoint on the claim's directory, not status (scraped every 2 s), so it lands
        # early in the run however fast the iterations are.
        latest = cluster.root / "pvc" / "default" / "ascend-workspace" / "checkpoints" / "resume" / \
            "latest_checkpointed_iteration.txt"
        deadline = time.monotonic() + 300
        while not latest.is_file() or int(latest.read_text() or 0) < 20:
            assert time.monotonic() < deadline, f"no checkpoint at 20 yet: {status()}"
            time.sleep(0.1)
        saved_before_kill = int(latest.read_text())
        cluster.runner.kill("default", "resume-1", signal.SIGKILL)  # exit 137: retryable

        deadline = time.monotonic() + 400
        while status().get("phase") not in ("Succeeded", "Failed"):
            assert time.monotonic() < deadline, f"did not finish: {status()}"
            time.sleep(0.3)
        final = status()
        log = (cluster.root / "pods" / "default" / "resume-0" / "container.log").read_text()
        resources.close()
    assert final["phase"] == "Succeeded", final
    assert final["restarts"] == 1
    assert "Restarting" in phases and phases.index("Restarting") < len(phases) - 1, phases
    assert phases[-2:] == ["Running", "Succeeded"], phases
    # Rank 0's log (the same pod name across the gang restart) shows the second run loading a checkpoint at or
    # after the one saved before the kill, and training on to the end from there.
    loaded = [line for line in log.splitlines() if line.startswith("loaded checkpoint")]
    assert len(loaded) == 1, log[-2000:]
    resumed_at = int(re.fullmatch(r"loaded checkpoint \S+ at iteration (\d+)", loaded[0]).group(1))
    assert resumed_at >= saved_before_kill > 0
    assert final["progress"]["iteration"] == final["progress"]["lastCheckpointIteration"] == 200
