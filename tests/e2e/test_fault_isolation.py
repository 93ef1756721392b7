"""Faults of a node or its device on a three-node local cluster: the gang restarts away from the node, the node is
listed in status.avoidedNodes, and neither restart spends runPolicy.backoffLimit (0 here: one counted restart
would fail the job). First a rank dies of a device error (its pod stays, with its log, next to the next attempt's
pods); then a node is lost (its kubelet goes silent, the taint manager evicts its pod) and a fresh node joins, where
the job continues and finishes."""
from __future__ import annotations

import copy
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from ascend_operator.api.group import LABEL_ATTEMPT, LABEL_JOB_NAME, LABEL_REPLICA_INDEX
from ascend_cluster.cluster import LocalCluster
from ascend_cluster.pod_environment import termination_message_file

from workspace import create_workspace, quickstart_job  # noqa: E402

pytestmark = pytest.mark.e2e


DEVICE_ERROR = ("RuntimeError: ACL stream synchronize failed.\n"
                "EZ9999: Inner Error! The error from device(chipId:0, dieId:0), an exception occurred: device error")


def _job() -> dict:
    job = quickstart_job()
    job["metadata"]["name"] = "isolate"
    train = job["spec"]["train"]
    train["training"]["trainIters"] = 20
    train["checkpoint"].update(save="/workspace/checkpoints/isolate", saveInterval=10)
    train["observability"]["logInterval"] = 10
    job["spec"]["runPolicy"] = {"backoffLimit": 0}
    # The user's own rule, one rank per node: the operator's avoidance is added to it, not put in its place.
    job["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {LABEL_JOB_NAME: "isolate"}}, "topologyKey": "kubernetes.io/hostname"}]}}
    return job


def test_device_fault_then_lost_node_restart_elsewhere_without_spending_backoff(tmp_path):
    with LocalCluster(fast_storage=True, root=tmp_path / "cluster", operator=True, nodes=3,
                      node_grace_s=4.0) as cluster:
        create_workspace(cluster)
        resources = cluster.client()
        atj, pods, events = (resources.resolve(k) for k in ("atj", "pods", "events"))
        resources.apply(_job())

        def status() -> dict:
            return resources.get(atj, "isolate", "default").get("status") or {}

        def wait(predicate, what: str, timeout: float = 240) -> dict:
            deadline = time.monotonic() + timeout
            while not predicate(current := status()):
                assert current.get("phase") not in ("Succeeded", "Failed"), f"{what}: {current}"
                assert time.monotonic() < deadline, f"{what}: {current}"
                time.sleep(0.3)
            return current

        def placement(attempt: int) -> dict[str, str]:
            """Where each pod of the attempt runs, by replica index."""
            return {p["metadata"]["labels"][LABEL_REPLICA_INDEX]: p["spec"].get("nodeName")
                    for p in resources.list(pods, "default") if not p["metadata"].get("deletionTimestamp")
                    and p["metadata"]["labels"].get(LABEL_ATTEMPT) == str(attempt)}

        wait(lambda s: s.get("phase") == "Running", "not running")  # faults at start-up are faults all the same
        first = placement(0)
        faulty = first["1"]
        # Rank 1's chip fails once it has logged (its log must outlive the restart): the process dies with the CANN
        # error as its termination message.
        log = cluster.root / "pods" / "default" / "isolate-1-0" / "container.log"
        wait(lambda s: log.exists() and "wait-for-master: " in log.read_text(), "rank 1 logged nothing")
        termination_message_file(cluster.root / "pods" / "default" / "isolate-1-0").write_text(DEVICE_ERROR)
        cluster.kill_pod("default", "isolate-1-0", signal.SIGKILL)
        after_device = wait(lambda s: s.get("phase") == "Running" and s.get("restarts") == 1, "no restart")
        assert [(a["node"], a["reason"]) for a in after_device["avoidedNodes"]] == [(faulty, "DeviceFault")]
        assert "EZ9999" in after_device["avoidedNodes"][0]["message"]
        second = placement(1)
        assert faulty not in second.values() and len(set(second.values())) == 2, second
        # The failed attempt's pod stays, with its log, next to the running attempt's (kubectl, as a user looks).
        listed = _kubectl(cluster, "get", "pods", "-l", f"{LABEL_JOB_NAME}=isolate", "-L", LABEL_ATTEMPT)
        rows = {line.split()[0]: (line.split()[2], line.split()[-1]) for line in listed.splitlines()[1:]}
        assert rows == {"isolate-1-0": ("Error", "0"), "isolate-0-1": ("Running", "1"),
                        "isolate-1-1": ("Running", "1")}, listed
        assert "wait-for-master: " in _kubectl(cluster, "logs", "isolate-1-0")
        pod = resources.get(pods, "isolate-0-1", "default")
        affinity = pod["spec"]["affinity"]
        assert affinity["podAntiAffinity"] == _job()["spec"]["affinity"]["podAntiAffinity"]
        assert affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [faulty]}]}]

        # Rank 0's node is lost; the third node is avoided, so the job can go on only once a new node joins.
        lost = second["0"]
        cluster.lose_node(lost)
        cluster.add_node("node-4")
        final = wait(lambda s: s.get("phase") == "Succeeded" or (s.get("restarts") == 2 and s.get("phase") in (
            "Running", "Succeeded")), "no restart after the node was lost", timeout=300)
        third = placement(2)
        assert sorted(third.values()) == sorted({*second.values(), "node-4"} - {lost}), third
        assert [(a["node"], a["reason"]) for a in final["avoidedNodes"]] == [(faulty, "DeviceFault"),
                                                                              (lost, "NodeFault")]
        assert "DeletionByTaintManager" in final["avoidedNodes"][1]["message"]
        final = wait(lambda s: s.get("phase") == "Succeeded", "did not finish", timeout=300)
        reasons = {e["reason"]: e["message"] for e in resources.list(events, "default")
                   if e["involvedObject"].get("name") == "isolate"}
        left = sorted(p["metadata"]["name"] for p in resources.list(pods, "default"))
        resources.close()
    assert final["phase"] == "Succeeded", final
    assert (final["restarts"], final["disruptions"]) == (2, 2)  # neither counted: backoffLimit 0 was enough
    assert final["progress"]["iteration"] == 20
    assert faulty in reasons["DeviceFault"] and lost in reasons["NodeFault"], reasons
    # backoffLimit 0 keeps two attempts: the third one's start deleted the first's failed pod; the second's pods
    # were all stopped (none had ended), so only the last attempt's are left.
    assert left == ["isolate-0-2", "isolate-1-2"], left


def _kubectl(cluster: LocalCluster, *args: str) -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (`make tools` installs it)")
    env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig), HOME=str(cluster.root))
    out = subprocess.run([kubectl, *args], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout
