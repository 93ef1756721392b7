"""The test as the kubelet of a few Nodes of its own, for fault sequences against the real control plane.

The Nodes are real objects: the real kube-scheduler binds pods to them, kube-controller-manager's node lifecycle
controller marks one NotReady when its heartbeat stops and its taint eviction evicts the pods bound to it. What the
test plays is the kubelet alone: it renews each live node's Lease and posts Ready, and writes what a kubelet would
report for the pods bound to a live node: Running, Succeeded or Failed with an exit code and a termination message,
and, for a pod being deleted, its terminal status followed by the kubelet's final delete (grace 0).

The nodes carry a taint (and a label) that only the tests' own pods tolerate (and select), so other tests' pods on
the same control plane never land on them.
"""
from __future__ import annotations

import datetime as dt
import json
import threading
import time
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

LABEL = "ascendtrain.dev/fault-sequences"
TAINT = {"key": LABEL, "value": "true", "effect": "NoSchedule"}
TOLERATION = {"key": LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class FakeNodes:
    """Nodes whose kubelet is this test: alive ones heartbeat every ``interval`` seconds."""

    def __init__(self, api: client.ApiClient, names: list[str], interval: float = 1.0) -> None:
        self.core, self.leases = client.CoreV1Api(api), client.CoordinationV1Api(api)
        self.names, self.interval = names, interval
        self.alive: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="fake-kubelet-heartbeat")

    def start(self) -> FakeNodes:
        for name in self.names:
            self._register(name)
        self.alive = set(self.names)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for name in self.names:
            try:
                self.core.delete_node(name)
            except ApiException:
                pass

    def _register(self, name: str) -> None:
        capacity = {"cpu": "64", "memory": "256Gi", "pods": "110"}
        node = {"metadata": {"name": name, "labels": {LABEL: "true", "kubernetes.io/hostname": name}},
                "spec": {"taints": [TAINT]}, "status": {"capacity": capacity, "allocatable": capacity}}
        try:
            self.core.create_node(node)
        except ApiException as e:
            if e.status != 409:
                raise
        self._post_ready(name)

    def _post_ready(self, name: str) -> None:
        self.core.patch_node_status(name, {"status": {"conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "the test is the kubelet",
            "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}]}})
        try:
            self.leases.patch_namespaced_lease(name, "kube-node-lease", {"spec": {"renewTime": _micro()}})
        except ApiException as e:
            if e.status != 404:
                raise
            uid = self.core.read_node(name).metadata.uid
            self.leases.create_namespaced_lease("kube-node-lease", {
                "metadata": {"name": name, "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}]},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": _micro()}})

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            for name in sorted(self.alive):
                try:
                    self._post_ready(name)
                except Exception:  # noqa: BLE001 - the control plane may be going away at the end
                    pass

    def lose(self, name: str) -> None:
        """The node's kubelet goes silent (a power loss): no heartbeat, nothing reported for its pods."""
        self.alive.discard(name)

    def restore(self, name: str) -> None:
        self._register(name)
        self.alive.add(name)

    def cordon(self, name: str, on: bool) -> None:
        self.core.patch_node(name, {"spec": {"unschedulable": on}})

    def ready(self, name: str) -> bool:
        node = self.core.read_node(name)
        ready = next((c for c in node.status.conditions or [] if c.type == "Ready"), None)
        taints = [t.key for t in node.spec.taints or []]
        return ready is not None and ready.status == "True" and "node.kubernetes.io/unreachable" not in taints \
            and "node.kubernetes.io/not-ready" not in taints


class FakeKubelet:
    """What a kubelet reports for the pods bound to the live ``nodes`` (raw JSON: the generated models drop
    fields the API adds later)."""

    def __init__(self, api: client.ApiClient, namespace: str, nodes: FakeNodes) -> None:
        self.core, self.namespace, self.nodes = client.CoreV1Api(api), namespace, nodes

    def pods(self, selector: str) -> list[dict[str, Any]]:
        answer = self.core.list_namespaced_pod(self.namespace, label_selector=selector, _preload_content=False)
        return sorted(json.loads(answer.data)["items"], key=lambda p: p["metadata"]["name"])

    def _patch(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        try:
            self.core.patch_namespaced_pod_status(pod["metadata"]["name"], self.namespace, {"status": status})
        except ApiException as e:
            if e.status != 404:
                raise

    def reports(self, pod: dict[str, Any]) -> bool:
        """Whether this pod's kubelet is alive to report it (bound to a live node)."""
        return (pod.get("spec") or {}).get("nodeName") in self.nodes.alive

    def start(self, pod: dict[str, Any]) -> None:
        self._patch(pod, {"phase": "Running", "podIP": "127.0.0.1", "startTime": _now(),
                          "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": _now()}],
                          "containerStatuses": [{"name": "engine", "ready": True, "restartCount": 0, "image": "x",
                                                 "imageID": "", "started": True,
                                                 "state": {"running": {"startedAt": _now()}}}]})

    def end(self, pod: dict[str, Any], exit_code: int | None, message: str | None = None,
            reason: str | None = None, condition: dict[str, Any] | None = None) -> None:
        """The container ended with ``exit_code`` (None: the pod failed before a container ran, ``reason`` says
        why, as OutOfcpu or NodeAffinity rejections say)."""
        phase = "Succeeded" if exit_code == 0 else "Failed"
        status: dict[str, Any] = {"phase": phase, "conditions": [{"type": "Ready", "status": "False",
                                                                  "lastTransitionTime": _now()}]}
        if condition:
            status["conditions"].append(condition)
        if exit_code is None:
            status.update(reason=reason or "Error", message=message or "")
        else:
            terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                          "finishedAt": _now(), **({"message": message} if message else {})}
            status["containerStatuses"] = [{"name": "engine", "ready": False, "restartCount": 0, "image": "x",
                                            "imageID": "", "state": {"terminated": terminated}}]
        self._patch(pod, status)

    def finish_deletions(self, selector: str, pods: list[dict[str, Any]] | None = None) -> int:
        """For each pod being deleted on a live node (of ``pods`` when the caller has just listed them): its
        terminal status (SIGTERM: 143 for a running container), then the kubelet's final delete. How many it
        finished."""
        done = 0
        for pod in self.pods(selector) if pods is None else pods:
            meta = pod["metadata"]
            if not meta.get("deletionTimestamp") or not self.reports(pod) or meta.get("deletionGracePeriodSeconds") == 0:
                continue
            phase = (pod.get("status") or {}).get("phase")
            if phase == "Running":
                self.end(pod, 143)
            elif phase == "Pending":
                self._patch(pod, {"phase": "Failed", "reason": "Terminated", "message": "deleted before it ran"})
            try:
                self.core.delete_namespaced_pod(meta["name"], self.namespace, grace_period_seconds=0,
                                                body=client.V1DeleteOptions(grace_period_seconds=0,
                                                                            preconditions={"uid": meta["uid"]}))
            except ApiException as e:
                if e.status not in (404, 409):
                    raise
            done += 1
        return done


def wait(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
