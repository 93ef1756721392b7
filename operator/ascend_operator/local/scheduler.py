"""``Scheduler``: the emulated kube-scheduler, one per local cluster.

Every ``poll_interval`` it lists the nodes and the pods, and binds each unbound pod whose ``schedulerName`` is
``default-scheduler`` (or unset) to a node that passes the filters of ``scheduler_filters``, oldest pod first,
posting ``Scheduled``; a pod no node can take gets ``PodScheduled=False`` (reason Unschedulable) and a
``FailedScheduling`` event in kube-scheduler's words, and is tried again on the next pass (kube-scheduler retries
on cluster events and after a back-off; here every pass). The nodes' allocatable, labels, taints and
``spec.unschedulable`` are read from the Node objects on each pass, so a device plugin lowering allocatable, a
cordon or a lost node takes effect at once. Pods of other schedulers (Volcano) are left alone, as there.
"""
from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from kubernetes.client.rest import ApiException

from .control_loop import ControlLoop
from .node_events import SCHEDULER, PodEvents
from .scheduler_filters import DEFAULT_SCHEDULER, choose_node, occupies_node


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Scheduler(ControlLoop):
    name = "scheduler"

    def __init__(self, kubeconfig: str | Path, poll_interval: float = 0.2):
        super().__init__(kubeconfig, poll_interval)
        self.events = PodEvents(self.core, "")

    def _list(self, call: Any) -> list[dict[str, Any]]:
        return json.loads(call(_preload_content=False).data)["items"]

    def sync_once(self) -> None:
        pods = self._list(self.core.list_pod_for_all_namespaces)
        waiting = [p for p in pods if not (p.get("spec") or {}).get("nodeName")
                   and not p["metadata"].get("deletionTimestamp")
                   and (p["spec"].get("schedulerName") or DEFAULT_SCHEDULER) == DEFAULT_SCHEDULER
                   and (p.get("status") or {}).get("phase", "Pending") == "Pending"]
        if not waiting:
            return
        nodes = self._list(self.core.list_node)
        placed: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            if occupies_node(pod):
                placed.setdefault(pod["spec"]["nodeName"], []).append(pod)
        waiting.sort(key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]))
        for pod in waiting:
            node, message = choose_node(pod, nodes, placed)
            if node is None:
                self._unschedulable(pod, message)
            elif self._bind(pod, node):
                placed.setdefault(node, []).append({**pod, "spec": {**pod["spec"], "nodeName": node}})

    def _unschedulable(self, pod: dict[str, Any], message: str) -> None:
        current = next((c for c in (pod.get("status") or {}).get("conditions") or []
                        if c.get("type") == "PodScheduled"), None)
        if current is not None and current.get("message") == message:
            return
        meta = pod["metadata"]
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
                     "lastTransitionTime": _now()}
        try:
            self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": {
                "phase": "Pending", "conditions": [condition]}}, _preload_content=False)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return
        self.events.post(pod, "FailedScheduling", message, SCHEDULER, warning=True)

    def _bind(self, pod: dict[str, Any], node: str) -> bool:
        meta = pod["metadata"]
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": meta["name"], "uid": meta.get("uid")},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        try:
            self.core.create_namespaced_pod_binding(meta["name"], meta["namespace"], body, _preload_content=False)
        except ApiException as exc:
            if exc.status not in (404, 409):  # deleted or bound meanwhile
                raise
            return False
        self.events.post(pod, "Scheduled", f"Successfully assigned {meta['namespace']}/{meta['name']} to {node}",
                         SCHEDULER)
        self.events.forget(meta.get("uid", ""))
        return True
