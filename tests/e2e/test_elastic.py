"""Elastic data parallelism end to end on a local cluster of two nodes with one device each (fp32, CPU):

a 2-pod job (DP 2) loses one of the nodes after its first checkpoint (the machine dies: its kubelet goes silent,
the node turns Unknown and taint eviction ends its pod) -> the gang restart avoids the node and cannot place its
second pod anywhere -> after elastic.scaleInTimeoutSeconds the operator restarts it on 1 pod (DP 1, same global
batch) -> a new node joins -> at the next checkpoint it scales out to 2 pods again and finishes, keeping only its last
2 checkpoints (checkpoint.keepLastCheckpoints). Every loss it logs, in every phase, equals the loss of an uninterrupted
DP 2 run (started in parallel with the same configuration) within 1e-5 relative.
"""
from __future__ import annotations

import re
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from kubernetes import client, config

from ascend_cluster.cluster import LocalCluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from test_train_torchrun import LINE, TINY, assert_ok, run_train  # noqa: E402

from workspace import create_workspace, quickstart_job  # noqa: E402

pytestmark = pytest.mark.e2e
DEVICE = "huawei.com/Ascend910"
TOLERANCE = 1e-5
ITERS, SAVE_INTERVAL = 200, 4  # long enough that the 1-pod phase outlasts a new node joining, even quiet
TRAIN = {**TINY, "parallel": {"useDistributedOptimizer": True},
         "training": {**TINY["training"], "trainIters": ITERS},
         "optimizer": {"lr": 3e-3, "lrDecayStyle": "cosine", "lrWarmupIters": 2},
         "observability": {"metricsPort": 9400, "logInterval": 1}}


def _job() -> dict:
    return {"apiVersion": "ascendtrain.dev/v1alpha1", "kind": "AscendTrainJob",
            "metadata": {"name": "elastic", "namespace": "default"},
            "spec": {"image": "ascend-train/engine-cpu:0.1.0", "nnodes": 2, "nprocPerNode": 1,
                     "devices": {"resource": DEVICE}, "shmSize": "none",
                     "volumes": [{"name": "w", "persistentVolumeClaim": {"claimName": "ascend-workspace"}}],
                     "volumeMounts": [{"name": "w", "mountPath": "/workspace"}],
                     "elastic": {"minNodes": 1, "scaleInTimeoutSeconds": 2},
                     # A node fault and two resizes: none of them may count against the user's restarts.
                     "runPolicy": {"backoffLimit": 0},
                     "train": {**TRAIN, "checkpoint": {"save": "/workspace/checkpoints/elastic",
                                                       "saveInterval": SAVE_INTERVAL, "keepLastCheckpoints": 2}}}}


def _wait(what: str, check, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return found


def test_job_losing_a_node_continues_smaller_and_scales_back_with_the_same_loss_curve(tmp_path, monkeypatch):
    reference: list = []
    ref_config = {**TRAIN, "observability": {**TRAIN["observability"], "metricsPort": 0},
                  "checkpoint": {"save": str(tmp_path / "reference"), "saveInterval": SAVE_INTERVAL}}
    runner = threading.Thread(target=lambda: reference.append(run_train(tmp_path, ref_config, nproc=2, timeout=400)))
    runner.start()  # the uninterrupted DP 2 run, alongside the cluster's waits
    monkeypatch.setenv("ASCEND_OPERATOR_PROGRESS_INTERVAL", "0.5")
    with LocalCluster(fast_storage=True, root=tmp_path / "cluster", operator=True, nodes=2, capacity={DEVICE: 1},
                      node_grace_s=6.0) as cluster:
        create_workspace(cluster)
        resources = cluster.client()
        atj, events = resources.resolve("atj"), resources.resolve("events")
        core = client.CoreV1Api(config.new_client_from_config(str(cluster.kubeconfig)))
        resources.apply(_job())
        status = lambda: resources.get(atj, "elastic", "default").get("status") or {}  # noqa: E731
        checkpoints = cluster.root / "pvc" / "default" / "ascend-workspace" / "checkpoints" / "elastic"
        tracker = checkpoints / "latest_checkpointed_iteration.txt"

        _wait("the first checkpoint", lambda: tracker.exists() and int(tracker.read_text()) >= SAVE_INTERVAL)
        node = core.read_namespaced_pod("elastic-1-0", "default").spec.node_name
        cluster.lose_node(node)  # no spare node: the job can only go on smaller

        _wait("the scale-in", lambda: (status().get("elastic") or {}).get("currentNodes") == 1)
        cluster.add_node("node-3")  # capacity comes back (the lost node itself stays avoided)

        final = _wait("the end", lambda: (s := status()).get("phase") in ("Succeeded", "Failed") and s)
        ours = [e for e in resources.list(events, "default") if e["involvedObject"].get("name") == "elastic"]
        reasons = [e["reason"] for e in ours]
        # Every attempt's pods (elastic-<index>-<attempt>), in the order the attempts ran.
        ran = sorted((cluster.root / "pods" / "default").glob("elastic-*-*"),
                     key=lambda d: [int(x) for x in d.name.split("-")[:0:-1]])  # by attempt, then index
        logs = "".join((d / "container.log").read_text() for d in ran)
        resources.close()
    runner.join()
    proc, curve = reference[0]
    assert_ok(proc)

    assert final["phase"] == "Succeeded", final
    assert final["elastic"] == {"desiredNodes": 2, "currentNodes": 2, "nodes": "2/2", "resizes": 2}, final
    assert [a["node"] for a in final.get("avoidedNodes") or []] == [node], final
    assert next(c for c in final["conditions"] if c["type"] == "Resized")["reason"] == "ScaledOut"
    assert "ScaledIn" in reasons and "ScaledOut" in reasons, reasons
    print(*(f"{e['reason']}: {e['message']}" for e in ours if e["reason"] in ("ScaledIn", "ScaledOut")), sep="\n")
    scaled_in = "data-parallel size 2 -> 1: the same global batch of 4 samples in 2 micro-batches"
    assert 0 <= logs.find(scaled_in) < logs.find("data-parallel size 1 -> 2"), logs[-3000:]
    # keepLastCheckpoints: 2 pruned every older checkpoint, across the resizes (beside them rank 0's goodput count)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["ascend_goodput.json", f"iter_{ITERS - SAVE_INTERVAL:07d}",
                                                             f"iter_{ITERS:07d}", "latest_checkpointed_iteration.txt"]
    assert [r["level"] for r in final["recoveries"]] == ["Replace", "Resize", "Resize"], final["recoveries"]

    expected = {it: (consumed, loss) for it, consumed, loss in curve}
    assert sorted(expected) == list(range(1, ITERS + 1))
    seen = [(int(m[1]), int(m[3]), float(m[4])) for m in LINE.finditer(logs)]
    assert {it for it, _, _ in seen} == set(expected), "every iteration trained in one phase or another"
    worst = 0.0
    for it, consumed, loss in seen:
        ref_consumed, ref_loss = expected[it]
        assert consumed == ref_consumed, f"iteration {it}: data position {consumed}, reference {ref_consumed}"
        worst = max(worst, abs(loss - ref_loss) / abs(ref_loss))
    assert worst <= TOLERANCE, f"largest relative loss difference {worst:.2e}"
    print(f"elastic 2 -> 1 -> 2 pods: {len(seen)} logged steps, largest relative loss difference {worst:.2e}")
