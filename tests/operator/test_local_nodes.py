"""A three-node local cluster as kubectl shows it: where the scheduler puts pods, why it cannot, cordons, a
device plugin lowering allocatable, and a node that is lost (Unknown, tainted, its pods evicted, PodGC)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest
import yaml

from ascend_cluster.cluster import LocalCluster

pytestmark = pytest.mark.operator

NPU = "huawei.com/Ascend910"
SLEEP = ["python", "-c", "import time; time.sleep(120)"]


def kubectl(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess:
    """The control plane's own kubectl as the admin."""
    env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig), HOME=str(cluster.root))
    result = subprocess.run([cluster.kubectl, *args], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    return result


def rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


def _pod(name: str, devices: int = 0, labels: dict | None = None, **spec) -> dict:
    container = {"name": "main", "image": "local", "command": SLEEP}
    if devices:
        container["resources"] = {"limits": {NPU: str(devices)}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": [container],
                     **spec}}


def _apply(cluster: LocalCluster, *objects: dict) -> None:
    path = cluster.root / f"{objects[0]['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    kubectl(cluster, "apply", "-f", str(path))


def _wait(what, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (result := what()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)
    return result


def _nodes_of_pods(cluster: LocalCluster) -> dict[str, str]:
    """pod -> NODE column of `kubectl get pods -o wide` (<none> while pending)."""
    table = rows(kubectl(cluster, "get", "pods", "-o", "wide").stdout)
    return {row[0]: row[6] for row in table[1:]}


def _pod_now(cluster: LocalCluster, name: str) -> dict:
    """The pod from the API (waiting through kubectl would cost a process per poll)."""
    resources = cluster.client()
    try:
        return resources.get(resources.resolve("pods"), name, "default")
    finally:
        resources.close()


def _scheduling_failure(cluster: LocalCluster, pod: str) -> str:
    events = kubectl(cluster, "get", "events", "--field-selector",
                     f"involvedObject.name={pod},reason=FailedScheduling", "-o", "json").stdout
    items = sorted(json.loads(events)["items"], key=lambda e: e["lastTimestamp"])
    return items[-1]["message"] if items else ""


def _state(pid: int) -> str:
    """The process's state letter (T: stopped), or "gone"."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


def _placed(cluster: LocalCluster, name: str) -> str:
    return _wait(lambda: _pod_now(cluster, name)["spec"].get("nodeName"))


def test_three_nodes_scheduling_cordon_device_loss_and_a_lost_node(tmp_path):
    with LocalCluster(fast_storage=True, root=tmp_path / "cluster", nodes=3, capacity={NPU: 2},
                      node_grace_s=4.0) as cluster:
        kubectl(cluster, "label", "node", "node-1", "zone=a")
        kubectl(cluster, "taint", "node", "node-2", "dedicated=train:NoSchedule")
        kubectl(cluster, "cordon", "node-3")
        # A device turns unhealthy on node-1: its device plugin lowers allocatable; the scheduler reads that.
        kubectl(cluster, "patch", "node", "node-1", "--subresource=status", "--type=merge", "-p",
                json.dumps({"status": {"allocatable": {NPU: "1"}}}))
        nodes = rows(kubectl(cluster, "get", "nodes").stdout)
        assert [r[:2] for r in nodes[1:]] == [["node-1", "Ready"], ["node-2", "Ready"],
                                               ["node-3", "Ready,SchedulingDisabled"]]
        tolerate = [{"key": "dedicated", "operator": "Equal", "value": "train", "effect": "NoSchedule"}]
        apart = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname"}]}}
        _apply(cluster, _pod("needs-two", devices=2),
               _pod("zone-a", devices=1, nodeSelector={"zone": "a"}),
               _pod("tolerant", devices=1, labels={"app": "x"}, tolerations=tolerate),
               _pod("zone-c", nodeSelector={"zone": "c"}, tolerations=tolerate))
        assert (_placed(cluster, "zone-a"), _placed(cluster, "tolerant")) == ("node-1", "node-2")
        _wait(lambda: _pod_now(cluster, "zone-c")["status"].get("conditions"))
        # kube-scheduler's own words (then what preemption could do about it)
        assert _scheduling_failure(cluster, "needs-two").startswith(
            "0/3 nodes are available: 1 Insufficient huawei.com/Ascend910, 1 node(s) had untolerated taint(s), "
            "1 node(s) were unschedulable."), _scheduling_failure(cluster, "needs-two")
        assert _scheduling_failure(cluster, "zone-c").startswith(
            "0/3 nodes are available: 1 node(s) were unschedulable, 2 node(s) didn't match Pod's node "
            "affinity/selector."), _scheduling_failure(cluster, "zone-c")
        described = kubectl(cluster, "describe", "pod", "needs-two").stdout
        assert re.search(r"Status:\s+Pending", described) and "PodScheduled   False" in described, described
        # Anti-affinity: not next to app=x (node-2); node-1 has no device left but this pod asks for none.
        _apply(cluster, _pod("apart", labels={"app": "other"}, affinity=apart, tolerations=tolerate))
        assert _placed(cluster, "apart") == "node-1"
        kubectl(cluster, "uncordon", "node-3")
        assert _placed(cluster, "needs-two") == "node-3"
        assert _nodes_of_pods(cluster) == {"apart": "node-1", "needs-two": "node-3", "tolerant": "node-2",
                                           "zone-a": "node-1", "zone-c": "<none>"}
        running = _wait(lambda: (p := _pod_now(cluster, "needs-two"))["status"].get("phase") == "Running" and p)
        pid = int(running["status"]["containerStatuses"][0]["containerID"].split("://")[1])

        cluster.lose_node("node-3")  # the machine dies: its processes stop, to be killed when the pod is gone
        assert _state(pid) == "T"
        _wait(lambda: _pod_now(cluster, "needs-two")["metadata"].get("deletionTimestamp"), timeout=20)
        assert rows(kubectl(cluster, "get", "nodes").stdout)[3][:2] == ["node-3", "NotReady"]
        node = json.loads(kubectl(cluster, "get", "node", "node-3", "-o", "json").stdout)
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("Unknown", "NodeStatusUnknown")
        assert {(t["key"], t["effect"]) for t in node["spec"]["taints"]} == {
            ("node.kubernetes.io/unreachable", "NoSchedule"), ("node.kubernetes.io/unreachable", "NoExecute")}
        evicted = json.loads(kubectl(cluster, "get", "pod", "needs-two", "-o", "json").stdout)
        target = next(c for c in evicted["status"]["conditions"] if c["type"] == "DisruptionTarget")
        assert (target["status"], target["reason"]) == ("True", "DeletionByTaintManager")
        assert rows(kubectl(cluster, "get", "pod", "needs-two").stdout)[1][2] == "Terminating"  # nobody confirms
        kubectl(cluster, "delete", "node", "node-3")  # PodGC removes what was bound to it
        # (it checks every 20 s and leaves an orphan for a 40 s quarantine first: kube-controller-manager's timing)
        _wait(lambda: "needs-two" not in _nodes_of_pods(cluster), timeout=90)
        _wait(lambda: _state(pid) in ("gone", "Z"))
        cluster.add_node("node-3")  # back: Ready, untainted, takes pods again
        _apply(cluster, _pod("needs-two-again", devices=2))
        assert _placed(cluster, "needs-two-again") == "node-3"
        assert rows(kubectl(cluster, "get", "nodes").stdout)[3][:2] == ["node-3", "Ready"]
