"""How many pods of one shape the cluster's nodes can hold, as kube-scheduler's filters would count them.

A node takes the pod when it is Ready, not cordoned (spec.unschedulable), carries no NoSchedule/NoExecute taint the
pod does not tolerate, matches the pod's nodeSelector and required node affinity (the nodes a fault made the job
avoid are kept off that way), and has room: status.allocatable minus the requests of the
non-terminal pods bound to it (spec.nodeName), counting the ``pods`` slot too. The job's own pods are left out of
the sum, since a resize replaces them. Pod (anti-)affinity and topology spread are not modelled: the operator's elastic
logic steps down one size when the count says the pods fit and the scheduler still does not place them.
"""
from __future__ import annotations

from decimal import Decimal
from typing import Any, Callable, Iterable

from kubernetes.utils import parse_quantity

TERMINAL_PHASES = ("Succeeded", "Failed")
HARD_EFFECTS = ("NoSchedule", "NoExecute")


def pod_requests(pod: dict[str, Any]) -> dict[str, Decimal]:
    """The pod's resource requests summed over its containers (a limit stands in for a missing request, as the API
    server defaults it), plus one ``pods`` slot."""
    total: dict[str, Decimal] = {"pods": Decimal(1)}
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        for name, amount in {**(resources.get("limits") or {}), **(resources.get("requests") or {})}.items():
            total[name] = total.get(name, Decimal(0)) + parse_quantity(amount)
    return total


def _tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint.get("key")
    return toleration.get("key") == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


def _matches(expression: dict[str, Any], value: str | None) -> bool:
    operator, values = expression.get("operator"), expression.get("values") or []
    if operator == "In":
        return value in values
    if operator == "NotIn":
        return value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and value.lstrip("-").isdigit() and values:
        return int(value) > int(values[0]) if operator == "Gt" else int(value) < int(values[0])
    return False


def _node_affinity_allows(node: dict[str, Any], pod: dict[str, Any]) -> bool:
    """The pod's requiredDuringScheduling node affinity: any term whose expressions (labels) and fields
    (metadata.name) all match."""
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    terms = (affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")
    if not terms:
        return True
    labels = (node.get("metadata") or {}).get("labels") or {}
    fields = {"metadata.name": node["metadata"]["name"]}
    return any(all(_matches(e, labels.get(e.get("key"))) for e in term.get("matchExpressions") or []) and
               all(_matches(e, fields.get(e.get("key"))) for e in term.get("matchFields") or [])
               for term in terms)


def takes(node: dict[str, Any], pod: dict[str, Any]) -> bool:
    """Whether the scheduler may place ``pod`` on ``node`` at all (resources aside)."""
    spec, status = node.get("spec") or {}, node.get("status") or {}
    if spec.get("unschedulable"):
        return False
    if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []):
        return False
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    for taint in spec.get("taints") or []:
        if taint.get("effect") in HARD_EFFECTS and not any(_tolerates(t, taint) for t in tolerations):
            return False
    labels = (node.get("metadata") or {}).get("labels") or {}
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    return all(labels.get(k) == v for k, v in selector.items()) and _node_affinity_allows(node, pod)


def pods_that_fit(nodes: Iterable[dict[str, Any]], pods: Iterable[dict[str, Any]], shape: dict[str, Any],
                  ignore: Callable[[dict[str, Any]], bool]) -> int:
    """How many copies of the pod ``shape`` the ``nodes`` can hold next to the bound, non-terminal ``pods`` other
    than those ``ignore`` picks (the job's own)."""
    used: dict[str, dict[str, Decimal]] = {}
    for p in pods:
        node_name = (p.get("spec") or {}).get("nodeName")
        if not node_name or (p.get("status") or {}).get("phase") in TERMINAL_PHASES or ignore(p):
            continue
        on_node = used.setdefault(node_name, {})
        for name, amount in pod_requests(p).items():
            on_node[name] = on_node.get(name, Decimal(0)) + amount
    wanted = {name: amount for name, amount in pod_requests(shape).items() if amount > 0}
    fit = 0
    for node in nodes:
        if not takes(node, shape):
            continue
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        on_node = used.get(node["metadata"]["name"], {})
        free = {name: parse_quantity(allocatable.get(name, 0)) - on_node.get(name, Decimal(0)) for name in wanted}
        fit += max(0, min(int(free[name] // amount) for name, amount in wanted.items()))
    return fit
