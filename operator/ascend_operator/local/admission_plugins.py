"""kube-apiserver's ServiceAccount and Priority admission plugins, for the pods they admit (both on by default).

They run on a pod's create, before the pod is validated, and refuse with 403 Forbidden:

- **ServiceAccount**: a pod without ``serviceAccountName`` gets ``default``; the named account must exist in the
  pod's namespace (``error looking up service account ns/x: serviceaccount "x" not found``). Every namespace
  gets its ``default`` account as soon as it exists, as the service-account controller makes it
  (``default_service_account``). Differs from a real server: no token volume is mounted.
- **Priority**: ``priorityClassName`` must name a PriorityClass (``no PriorityClass with name x was found``); the
  pod gets its ``priority`` and ``preemptionPolicy`` from it, or from the global default class, else priority 0;
  a pod that writes another ``priority`` itself is refused. The two system classes exist on every cluster
  (``SYSTEM_PRIORITY_CLASSES``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

DEFAULT_SERVICE_ACCOUNT = "default"
PREEMPT_LOWER = "PreemptLowerPriority"
SYSTEM_PRIORITY_CLASSES = {"system-cluster-critical": 2000000000, "system-node-critical": 2000001000}


def default_service_account(namespace: str) -> dict[str, Any]:
    """The account the service-account controller makes in every namespace."""
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": DEFAULT_SERVICE_ACCOUNT, "namespace": namespace}}


def system_priority_classes() -> list[dict[str, Any]]:
    """The classes kube-apiserver makes at start-up."""
    return [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
             "value": value, "preemptionPolicy": PREEMPT_LOWER,
             "description": "Used for system critical pods that must not be moved from their current node."
             if name == "system-node-critical" else "Used for system critical pods that must run in the cluster, "
                                                    "but can be moved to another node if necessary."}
            for name, value in SYSTEM_PRIORITY_CLASSES.items()]


def admit_pod(pod: dict[str, Any], service_account: Callable[[str, str], dict | None],
              priority_classes: Callable[[], list[dict[str, Any]]]) -> str | None:
    """Apply both plugins to a new ``pod`` (changed in place); the reason it is forbidden, or None."""
    spec, namespace = pod.setdefault("spec", {}), pod["metadata"].get("namespace", "")
    account = spec.get("serviceAccountName") or spec.get("serviceAccount") or DEFAULT_SERVICE_ACCOUNT
    spec["serviceAccountName"] = spec["serviceAccount"] = account
    if service_account(namespace, account) is None:
        return f'error looking up service account {namespace}/{account}: serviceaccount "{account}" not found'
    classes = priority_classes()
    if spec.get("priorityClassName"):
        chosen = next((c for c in classes if c["metadata"]["name"] == spec["priorityClassName"]), None)
        if chosen is None:
            return f"no PriorityClass with name {spec['priorityClassName']} was found"
    else:
        chosen = next((c for c in classes if c.get("globalDefault")), None)
        if chosen is not None:
            spec["priorityClassName"] = chosen["metadata"]["name"]
    priority = chosen["value"] if chosen else 0
    preemption = (chosen or {}).get("preemptionPolicy") or PREEMPT_LOWER
    if spec.get("priority") is not None and spec["priority"] != priority:
        return (f"the integer value of priority ({spec['priority']}) must not be provided in pod spec; priority "
                f"admission controller computed {priority} from the given PriorityClass name")
    if spec.get("preemptionPolicy") is not None and spec["preemptionPolicy"] != preemption:
        return (f"the string value of PreemptionPolicy ({spec['preemptionPolicy']}) must not be provided in pod "
                f"spec; priority admission controller computed {preemption} from the given PriorityClass name")
    spec["priority"], spec["preemptionPolicy"] = priority, preemption
    return None
