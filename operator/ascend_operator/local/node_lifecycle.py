"""``NodeLifecycle``: the parts of kube-controller-manager that act on nodes, for the local cluster.

- Node lifecycle controller: a node whose kubelet has not posted status for ``grace_s``
  (``--node-monitor-grace-period``: 40 s by default, as on a real cluster; tests set a few seconds) gets
  Ready=Unknown (reason NodeStatusUnknown, "Kubelet stopped posting node status."), its pods Ready=False, and the taints of its condition
  (TaintNodesByCondition / taint-based eviction): ``node.kubernetes.io/unreachable`` (Unknown) or
  ``node.kubernetes.io/not-ready`` (False), NoSchedule and NoExecute, and ``node.kubernetes.io/unschedulable``
  :NoSchedule while it is cordoned; they go away when the node is Ready again.
- Taint eviction (the "taint manager"): a pod on a node with a NoExecute taint it does not tolerate (or tolerates
  for ``tolerationSeconds`` that have passed) gets the condition DisruptionTarget (reason DeletionByTaintManager)
  and is deleted; its kubelet finishes the deletion, or, on a node that is gone, nobody does and it stays
  Terminating, as there.
- Pod garbage collector: pods bound to a node that no longer exists are marked Failed with DisruptionTarget
  (reason DeletionByPodGC) and force-deleted; so are terminating pods on a not-ready node tainted
  ``node.kubernetes.io/out-of-service`` (the non-graceful node shutdown).

Differs from kube-controller-manager: the default tolerations that the DefaultTolerationSeconds admission plugin
adds to every pod (not-ready and unreachable for 300 s) are not added, so pods without their own toleration are
evicted as soon as the taint is there; PodGC has no 40 s quarantine; a pass runs every ``poll_interval``.
"""
from __future__ import annotations

import datetime
import json
import logging
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from .control_loop import ControlLoop
from .scheduler_filters import UNSCHEDULABLE_TAINT, tolerates

logger = logging.getLogger(__name__)
NOT_READY, UNREACHABLE, OUT_OF_SERVICE = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable",
                                          "node.kubernetes.io/out-of-service")
MANAGED_TAINTS = (NOT_READY, UNREACHABLE, UNSCHEDULABLE_TAINT)
DEFAULT_GRACE_S = 40.0  # a busy laptop must not lose nodes that are only slow to post


def _stamp(at: datetime.datetime | None = None) -> str:
    return (at or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(stamp: str | None) -> datetime.datetime | None:
    if not stamp:
        return None
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)


def ready_condition(node: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), {})


def condition_taints(node: dict[str, Any]) -> list[tuple[str, str]]:
    """The (key, effect) taints the controller keeps on ``node`` for its Ready condition and cordon."""
    status = ready_condition(node).get("status", "Unknown")
    wanted = []
    if status != "True":
        key = UNREACHABLE if status == "Unknown" else NOT_READY
        wanted += [(key, "NoSchedule"), (key, "NoExecute")]
    if (node.get("spec") or {}).get("unschedulable"):
        wanted.append((UNSCHEDULABLE_TAINT, "NoSchedule"))
    return wanted


class NodeLifecycle(ControlLoop):
    name = "node lifecycle"

    def __init__(self, kubeconfig: str | Path, grace_s: float = DEFAULT_GRACE_S, poll_interval: float = 0.5):
        super().__init__(kubeconfig, poll_interval)
        self.grace_s = grace_s

    def sync_once(self, at: datetime.datetime | None = None) -> None:
        at = at or datetime.datetime.now(datetime.timezone.utc)
        nodes = {n["metadata"]["name"]: n for n in
                 json.loads(self.core.list_node(_preload_content=False).data)["items"]}
        pods = json.loads(self.core.list_pod_for_all_namespaces(_preload_content=False).data)["items"]
        for name, node in nodes.items():
            nodes[name] = node = self._monitor(node, at)
            self._taint(node, at)
        for pod in pods:
            host = (pod.get("spec") or {}).get("nodeName")
            if not host:
                continue
            if host not in nodes:
                self._collect(pod, "PodGC: node no longer exists")
            elif pod["metadata"].get("deletionTimestamp"):
                taints = {t["key"] for t in (nodes[host].get("spec") or {}).get("taints") or []}
                if OUT_OF_SERVICE in taints and ready_condition(nodes[host]).get("status") != "True":
                    self._collect(pod, "PodGC: node is out of service")
            else:
                if ready_condition(nodes[host]).get("status") == "Unknown":
                    self._mark_not_ready(pod)
                self._evict_if_tainted(pod, nodes[host], at)

    # -- node lifecycle -------------------------------------------------------------------------

    def _monitor(self, node: dict[str, Any], at: datetime.datetime) -> dict[str, Any]:
        ready = ready_condition(node)
        heartbeat = _parse(ready.get("lastHeartbeatTime"))
        if ready.get("status") == "Unknown" or heartbeat is None or \
                (at - heartbeat).total_seconds() <= self.grace_s:
            return node
        stamp = _stamp(at)
        conditions = [{**c, "status": "Unknown", "reason": "NodeStatusUnknown",
                       "message": "Kubelet stopped posting node status.", "lastTransitionTime": stamp}
                      for c in (node.get("status") or {}).get("conditions") or []]
        try:
            updated = self.core.patch_node_status(node["metadata"]["name"], {"status": {"conditions": conditions}},
                                                  _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return node
            raise
        logger.info("node %s: no status for %.0fs: Ready=Unknown", node["metadata"]["name"],
                    (at - heartbeat).total_seconds())
        return json.loads(updated.data)

    def _taint(self, node: dict[str, Any], at: datetime.datetime) -> None:
        taints = (node.get("spec") or {}).get("taints") or []
        wanted = condition_taints(node)
        have = [(t["key"], t.get("effect")) for t in taints if t["key"] in MANAGED_TAINTS]
        if sorted(have) == sorted(wanted):
            return
        kept = [t for t in taints if t["key"] not in MANAGED_TAINTS or (t["key"], t.get("effect")) in wanted]
        added = [{"key": k, "effect": e} | ({"timeAdded": _stamp(at)} if e == "NoExecute" else {})
                 for k, e in wanted if (k, e) not in have]
        body = {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                "spec": {"taints": kept + added or None}}
        try:
            updated = self.core.patch_node(node["metadata"]["name"], body, _preload_content=False)
        except ApiException as exc:
            if exc.status in (404, 409):  # gone, or changed meanwhile: the next pass looks again
                return
            raise
        node.update(json.loads(updated.data))

    # -- pods -----------------------------------------------------------------------------------

    def _evict_if_tainted(self, pod: dict[str, Any], node: dict[str, Any], at: datetime.datetime) -> bool:
        tolerations = (pod.get("spec") or {}).get("tolerations") or []
        for taint in (node.get("spec") or {}).get("taints") or []:
            if taint.get("effect") != "NoExecute":
                continue
            matching = [t for t in tolerations if tolerates(t, taint)]
            if matching and all(t.get("tolerationSeconds") is None for t in matching):
                continue  # tolerated for ever
            if matching:
                seconds = min(t["tolerationSeconds"] for t in matching if t.get("tolerationSeconds") is not None)
                added = _parse(taint.get("timeAdded")) or at
                if (at - added).total_seconds() < seconds:
                    continue
            self._disrupt(pod, "DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint")
            self._delete(pod, grace=None)
            return True
        return False

    def _mark_not_ready(self, pod: dict[str, Any]) -> None:
        conditions = (pod.get("status") or {}).get("conditions") or []
        if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            return
        changed = [{**c, "status": "False", "lastTransitionTime": _stamp()} if c.get("type") == "Ready" else c
                   for c in conditions]
        self._patch_status(pod, {"conditions": changed})

    def _collect(self, pod: dict[str, Any], message: str) -> None:
        if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            self._disrupt(pod, "DeletionByPodGC", message, phase="Failed")
        self._delete(pod, grace=0)

    def _disrupt(self, pod: dict[str, Any], reason: str, message: str, phase: str | None = None) -> None:
        conditions = [c for c in (pod.get("status") or {}).get("conditions") or []
                      if c.get("type") != "DisruptionTarget"]
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message,
                           "lastTransitionTime": _stamp()})
        self._patch_status(pod, {"conditions": conditions} | ({"phase": phase} if phase else {}))

    def _patch_status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        meta = pod["metadata"]
        try:
            updated = self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": status},
                                                            _preload_content=False)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return
        pod.update(json.loads(updated.data))

    def _delete(self, pod: dict[str, Any], grace: int | None) -> None:
        meta = pod["metadata"]
        try:
            self.core.delete_namespaced_pod(meta["name"], meta["namespace"], grace_period_seconds=grace,
                                            body=client.V1DeleteOptions(preconditions={"uid": meta["uid"]}))
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise
