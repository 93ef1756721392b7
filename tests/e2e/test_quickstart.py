"""The whole path on the embedded local cluster, driven from Python with the SDK as a notebook would: create the
quickstart (validated before it is sent), the operator makes pods, the runner starts torchrun in each, rank 0's
metrics reach status.progress while it runs, the job ends Succeeded with a checkpoint, and its logs and kept
history (rows for pandas) read back; suspend / resume / delete act on a second job. Beside it, a job whose
dataset does not exist fails with the engine's own words where users look (the real kubectl: -o wide and
describe; ascend-train get), its failed pods and their logs kept."""
from __future__ import annotations

import copy
import math
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from kubernetes.client.rest import ApiException

from ascend_train.cli import _heartbeat, main as ascend_train
from ascend_cluster.cluster import LocalCluster
from ascend_operator.sdk import InvalidSpec, TrainClient

from workspace import create_workspace, quickstart_job  # noqa: E402

pytestmark = pytest.mark.e2e




MISSING = "/workspace/data/no-such-corpus"


def _without_data(job: dict) -> dict:
    broken = copy.deepcopy(job)
    broken["metadata"]["name"] = "nodata"
    broken["spec"]["nnodes"] = 1  # one process: the check costs the quickstart beside it little CPU
    broken["spec"]["train"]["parallel"]["tensorModelParallelSize"] = 1
    broken["spec"]["train"]["data"] = {"dataPath": [MISSING]}
    broken["spec"]["train"]["checkpoint"]["save"] = "/workspace/checkpoints/nodata"
    return broken


def _failure_is_where_users_look(cluster: LocalCluster, capsys) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (`make tools` installs it)")
    env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig), HOME=str(cluster.root))

    def run(*args: str) -> str:
        out = subprocess.run([kubectl, *args], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    # The local runner ran the engine on the claim's directory; the cause quotes the path as a pod on a cluster
    # would (the container's /workspace/...), not the host directory behind it.
    cause = "failed: exit code 1 (Error): bad training data: data.dataPath: no dataset for prefix '" + MISSING
    wide = run("get", "atj", "nodata", "-o", "wide")
    assert wide.splitlines()[0].split()[-1] == "FAILURE" and cause in wide and "no-such-corpus" in wide, wide
    assert "Traceback" not in wide and "ChildFailedError" not in wide
    assert cause in run("describe", "atj", "nodata")
    assert ascend_train(["--root", str(cluster.root), "get", "atj"]) == 0
    assert cause in capsys.readouterr().out
    # The failed pods stay (cleanPodPolicy Running deletes only pods still running), with their logs.
    failed = [line.split()[0] for line in run("get", "pods", "-l", "ascendtrain.dev/job-name=nodata").splitlines()[1:]
              if line.split()[2] == "Error"]
    assert failed, run("get", "pods")
    assert "no dataset for prefix" in run("logs", failed[0])


def test_quickstart_runs_to_success_with_live_progress_from_the_sdk(tmp_path, capsys):
    job = quickstart_job()
    train_iters = job["spec"]["train"]["training"]["trainIters"]
    seen_running_progress, heartbeats = [], []
    with LocalCluster(fast_storage=True, root=tmp_path / "cluster", operator=True) as cluster, \
            TrainClient(cluster.kubeconfig) as sdk:
        create_workspace(cluster)
        bad = copy.deepcopy(job)
        bad["spec"]["train"]["parallel"]["tensorModelParalelSize"] = 2
        with pytest.raises(InvalidSpec, match='spec.train.parallel.tensorModelParalelSize: unknown field '
                                              '"tensorModelParalelSize" \\(did you mean "tensorModelParallelSize"'):
            sdk.create(bad)
        sdk.create(job)
        sdk.create(_without_data(job))
        # A spec dict is enough; this one waits for a DatasetPrep that never comes, so it starts no pods.
        held = sdk.create({**job["spec"], "datasetPrepRef": "not-yet"}, name="held")
        sdk.suspend("held")
        assert sdk.wait("held", "Suspended", timeout=120).phase == "Suspended"
        sdk.resume("held")
        assert sdk.wait("held", "Pending", timeout=120).raw["spec"]["runPolicy"]["suspend"] is False
        sdk.delete("held")
        deadline = time.monotonic() + 480
        status = sdk.get("quickstart")
        while time.monotonic() < deadline and status.phase not in ("Succeeded", "Failed"):
            if sdk.get("nodata").phase == "Failed" and "nodata" not in seen_running_progress:
                seen_running_progress.append("nodata")  # checked once, while the quickstart still trains
                _failure_is_where_users_look(cluster, capsys)
            if status.phase == "Running" and status.progress.get("iteration"):
                seen_running_progress.append(status.progress["iteration"])
            elif status.phase == "Running":  # what `local demo` prints while the pods start: rank 0's latest line
                with cluster.client() as resources:
                    heartbeats.append(_heartbeat(resources, [status.raw], cluster.root))
            time.sleep(0.5)
            status = sdk.get("quickstart")
        done = sdk.wait("quickstart", "Succeeded", timeout=5)
        assert sorted(j.name for j in sdk.list()) == ["nodata", "quickstart"] and held.name == "held"
        log = list(sdk.logs("quickstart", 0))
        rows = sdk.history("quickstart")
        pods = {p.metadata.name: p for p in sdk.core.list_namespaced_pod("default").items
                if p.metadata.name.startswith("quickstart")}
        with pytest.raises(ApiException) as gone:
            sdk.get("held")
        assert gone.value.status == 404
    status = done.raw["status"]
    assert set(pods) == {"quickstart-0-0", "quickstart-1-0"}
    # Progress was read live from rank 0 while training ran, and the final figures came with the exit.
    assert "nodata" in seen_running_progress, "the job without data did not fail while the quickstart ran"
    assert [i for i in seen_running_progress if i != "nodata"], "no live progress while Running"
    assert any("; quickstart-0-0: [t" in line for line in heartbeats), heartbeats  # [torchrun] or [train] ...
    progress = status["progress"]
    assert progress["iteration"] == train_iters == progress["trainIters"]
    assert math.isfinite(progress["loss"]) and progress["loss"] < 5.0
    assert progress["tokensPerSecond"] > 0
    # kubectl's LOSS and TOK/S columns: the same figures for humans, written by the operator next to the raw ones.
    assert progress["columns"] == {"loss": f"{progress['loss']:#.4g}",
                                   "tokensPerSecond": str(round(progress["tokensPerSecond"]))}
    assert status["replicas"]["succeeded"] == 2
    # Rank 0's output, line by line, and the history as rows of figures by iteration.
    assert any(f"iteration {train_iters:8d}/{train_iters:8d}" in line for line in log), log[-5:]
    assert rows and rows[-1]["iteration"] == train_iters and rows[-1]["loss"] == progress["loss"]
    assert all({"iteration", "time", "loss", "learningRate", "tokensPerSecond"} <= set(r) for r in rows), rows
    assert [r["iteration"] for r in rows] == sorted({r["iteration"] for r in rows})
    # The checkpoint is in Megatron's layout, on the claim's directory, one shard per TP rank.
    ckpt = tmp_path / "cluster" / "pvc" / "default" / "ascend-workspace" / "checkpoints" / "quickstart"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == str(train_iters)
    for rank in (0, 1):
        assert (ckpt / f"iter_{train_iters:07d}" / f"mp_rank_{rank:02d}" / "model_optim_rng.pt").stat().st_size > 0
