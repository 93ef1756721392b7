"""The core/v1 Events a scheduler and a kubelet post about a pod (Scheduled, FailedScheduling, Pulled, Created,
Started, Killing, BackOff, Failed), for the local runner that plays both.

Repeats are aggregated as client-go's event correlator does: the same reason and message about the same pod
patches the existing Event's ``count`` and ``lastTimestamp`` instead of creating another one, so
``kubectl get events`` shows LAST SEEN and COUNT and ``kubectl describe pod`` lists ``(x3 over 20s)``.
Losing an event is not fatal (as in client-go, which drops them when the API is unreachable).
"""
from __future__ import annotations

import datetime
import logging
import time
from typing import Any

from kubernetes.client.rest import ApiException

logger = logging.getLogger(__name__)
SCHEDULER = "default-scheduler"
KUBELET = "kubelet"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class PodEvents:
    """Posts events about pods through a ``CoreV1Api``; one instance per node."""

    def __init__(self, core: Any, node_name: str):
        self.core, self.node_name = core, node_name
        self._seen: dict[tuple[str, str, str, str], tuple[str, int]] = {}  # (uid, component, reason, message)

    def post(self, pod: dict[str, Any], reason: str, message: str, component: str = KUBELET,
             warning: bool = False, container: str | None = None) -> None:
        meta = pod["metadata"]
        key = (meta.get("uid", ""), component, reason, message)
        stamp = _now()
        try:
            if key in self._seen:
                name, count = self._seen[key]
                self.core.patch_namespaced_event(name, meta["namespace"], {"count": count + 1, "lastTimestamp": stamp},
                                                _content_type="application/merge-patch+json")
                self._seen[key] = (name, count + 1)
                return
            involved = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "namespace": meta["namespace"],
                        "uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")}
            if container:
                involved["fieldPath"] = f"spec.containers{{{container}}}"
            name = f"{meta['name']}.{time.time_ns():x}"  # client-go's: key order is time order (describe)
            source = {"component": component} | ({"host": self.node_name} if component == KUBELET else {})
            self.core.create_namespaced_event(meta["namespace"], {
                "apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": meta["namespace"]},
                "involvedObject": involved, "reason": reason, "message": message,
                "type": "Warning" if warning else "Normal", "count": 1, "firstTimestamp": stamp,
                "lastTimestamp": stamp, "source": source, "reportingComponent": component,
                "reportingInstance": self.node_name if component == KUBELET else ""})
            self._seen[key] = (name, 1)
        except ApiException as exc:
            logger.debug("event %s about pod %s not posted: %s", reason, meta.get("name"), exc.reason)

    def forget(self, uid: str) -> None:
        """Drop the aggregation state of a pod that is gone."""
        for key in [k for k in self._seen if k[0] == uid]:
            del self._seen[key]
