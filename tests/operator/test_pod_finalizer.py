"""A pod's end is never missed: a node deleted while the operator is stopped (as during a failover) is a node
fault when the operator comes back, not "pod index 1 was deleted".

Two nodes with one device each, a job of two CPU pods sleeping (``trainer:``, no engine: ``elastic`` needs the
engine, and the fault is decided before any resize), ``backoffLimit: 0``. With the operator stopped, the node of
pod 1 dies and its Node object is deleted: kube-controller-manager's PodGC marks the pod Failed with
``DisruptionTarget: DeletionByPodGC`` and deletes it at once. The operator's finalizer keeps the pod, with that
status, until the operator, started again, has recorded it: a NodeFault (the node avoided, a gang restart that is a
disruption, not counted against backoffLimit); the pod then leaves the API. (An elastic job takes the same path
first and then scales in: tests/e2e/test_elastic.py shows the rest.)
"""
from __future__ import annotations

import pytest

from ascend_cluster.cluster import LocalCluster
from ascend_operator.api.group import POD_FINALIZER
from test_operator_train_job import wait_for

pytestmark = pytest.mark.operator

DEVICE = "huawei.com/Ascend910"


def _job() -> dict:
    return {"apiVersion": "ascendtrain.dev/v1alpha1", "kind": "AscendTrainJob",
            "metadata": {"name": "held", "namespace": "default"},
            "spec": {"image": "ascend-train/engine-cpu:0.1.0", "nnodes": 2, "nprocPerNode": 1,
                     "devices": {"resource": DEVICE}, "shmSize": "none",
                     "runPolicy": {"backoffLimit": 0},
                     "trainer": {"command": ["python", "-c", "import time; time.sleep(600)"], "progress": "none"}}}


def test_a_node_deleted_while_the_operator_is_stopped_is_a_node_fault_not_a_deleted_pod(tmp_path, monkeypatch):
    monkeypatch.setenv("ASCEND_OPERATOR_PROGRESS_INTERVAL", "0.5")
    # node_grace_s: long, so that PodGC (not taint eviction) is what ends the pod of the lost node.
    with LocalCluster(fast_storage=True, root=tmp_path / "cluster", operator=True, nodes=2, capacity={DEVICE: 1},
                      node_grace_s=300.0) as cluster:
        resources = cluster.client()
        atj, pods, nodes = resources.resolve("atj"), resources.resolve("pods"), resources.resolve("nodes")
        status = lambda: resources.get(atj, "held", "default").get("status") or {}  # noqa: E731

        def pod(name: str) -> dict | None:
            found = [p for p in resources.list(pods, "default") if p["metadata"]["name"] == name]
            return found[0] if found else None

        resources.apply(_job())
        wait_for(what="the job running", predicate=lambda: status().get("phase") == "Running", timeout=60)
        lost = pod("held-1-0")
        assert POD_FINALIZER in lost["metadata"]["finalizers"]
        node = lost["spec"]["nodeName"]

        cluster.operator.terminate()  # a failover: nobody watches the job's pods for a while
        cluster.operator.wait(30)
        cluster.lose_node(node)
        resources.delete(nodes, node, None)
        # PodGC checks every 20 s and gives an orphan a 40 s quarantine (kube-controller-manager's timing).
        gone = wait_for(what="PodGC", timeout=120,
                        predicate=lambda: (p := pod("held-1-0")) and p["metadata"].get("deletionTimestamp") and p)
        target = next(c for c in gone["status"]["conditions"] if c["type"] == "DisruptionTarget")
        assert (gone["status"]["phase"], target["reason"]) == ("Failed", "DeletionByPodGC")
        assert status()["phase"] == "Running"  # nobody has told the job yet

        cluster.start_operator()
        wait_for(what="the node fault recorded", predicate=lambda: status().get("avoidedNodes"), timeout=60)
        wait_for(what="the pod released", predicate=lambda: pod("held-1-0") is None, timeout=60)
        # The new gang avoids the node: its pod 1 has nowhere to go (one node, one device left).
        final = wait_for(what="the next attempt", timeout=60,
                         predicate=lambda: (s := status()).get("replicas", {}).get("active") == 2 and s)
        # Attempt 0's pod 0 was stopped by the gang restart and released with the rest.
        wait_for(what="attempt 0 gone", timeout=60,
                 predicate=lambda: {p["metadata"]["name"] for p in resources.list(pods, "default")} ==
                 {"held-0-1", "held-1-1"})
        resources.close()

    assert final["phase"] == "Restarting", final
    assert [(a["node"], a["reason"]) for a in final["avoidedNodes"]] == [(node, "NodeFault")], final
    assert "DeletionByPodGC" in final["avoidedNodes"][0]["message"], final
    assert final["disruptions"] == 1 and final["restarts"] == 1, final
    messages = " ".join(c.get("message", "") for c in final["conditions"])
    assert "BackoffLimitExceeded" not in messages and "was deleted" not in messages, final
