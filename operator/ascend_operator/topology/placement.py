"""The reconcile's part in topology: once every pod of the current attempt is bound, decide the NODE_RANK order
(``decide``, written in ``status.placement`` by the reconcile's record step), then give each pod its rank
(``to_annotate``: the act step patches the pods' annotation, which the engine's launcher waits for).

A pod replaced within the attempt (deleted before it ran) keeps its index's rank: the order is the attempt's, so
the pods that already run keep theirs. A new attempt (a gang restart, a resize) is placed and ordered anew.
"""
from __future__ import annotations

from typing import Any

from ascend_engine.node_rank import NODE_RANK_ANNOTATION

from ..cache.job_pods import JobPods, index, terminating
from ..client import fan_out
from ..client.kubeclient import kube
from ..lifecycle.status import now
from . import order


def decide(rank_order: tuple[list[str], str | None, int] | None, current: JobPods, expected: int, attempt: int,
           status: dict[str, Any]) -> dict[str, Any]:
    """``status`` with ``placement`` for ``attempt`` once all ``expected`` pods are bound (``rank_order``: the
    job's levels, tensor-parallel level and pods per tensor-parallel group, or None where ranks are not ordered)."""
    if rank_order is None:
        return status
    if (status.get("placement") or {}).get("attempt") == attempt:
        return status
    live = {index(p): p for p in current if not terminating(p)}
    if sorted(live) != list(range(expected)) or not all((p.get("spec") or {}).get("nodeName") for p in live.values()):
        return status
    levels, tp_level, tp_pods = rank_order
    nodes = {i: p["spec"]["nodeName"] for i, p in live.items()}
    labels = _node_labels(set(nodes.values()))
    ranked = order.rank_order(nodes, labels, levels)
    placement: dict[str, Any] = {"attempt": attempt, "podsByRank": order.ranges(ranked),
                                 "domains": order.domains(nodes, labels, levels), "time": now()}
    if tp_level and tp_pods > 1:
        placement["tensorParallelGroups"], placement["tensorParallelGroupsSplit"] = \
            order.split_groups(ranked, nodes, labels, tp_level, tp_pods)
    return {**status, "placement": placement}


def _node_labels(names: set[str]) -> dict[str, dict[str, str]]:
    """The labels of the nodes the pods are bound to (one GET a node: a job's nodes are a few of the cluster's)."""
    found = fan_out.each(kube().get_node, sorted(names))
    out: dict[str, dict[str, str]] = {}
    for name, node in zip(sorted(names), found):
        if isinstance(node, Exception):
            raise node
        out[name] = ((node or {}).get("metadata") or {}).get("labels") or {}
    return out


def ranks(status: dict[str, Any], attempt: int) -> dict[int, int] | None:
    """Pod index -> NODE_RANK of ``attempt``, or None when its order is not decided."""
    placement = status.get("placement") or {}
    if placement.get("attempt") != attempt:
        return None
    return {pod: rank for rank, pod in enumerate(order.parse_ranges(placement.get("podsByRank", "")))}


def to_annotate(status: dict[str, Any], current: JobPods, attempt: int) -> list[tuple[dict[str, Any], int]]:
    """The current attempt's live pods whose annotation does not yet say their rank, with it."""
    by_index = ranks(status, attempt)
    if by_index is None:
        return []
    return [(p, by_index[index(p)]) for p in current if not terminating(p) and index(p) in by_index and
            ((p["metadata"].get("annotations") or {}).get(NODE_RANK_ANNOTATION) != str(by_index[index(p)]))]


def summary(placement: dict[str, Any]) -> str:
    """The event's words for a decided order."""
    spans = ", ".join(f"{count} {level.rsplit('/', 1)[-1]}{'s' if count != 1 else ''}"
                      for level, count in (placement.get("domains") or {}).items())
    text = f"NODE_RANK ordered by topology for attempt {placement['attempt']}: pods by rank " \
           f"{placement['podsByRank']}; the pods span {spans}"
    if placement.get("tensorParallelGroups"):
        whole = placement["tensorParallelGroups"] - placement.get("tensorParallelGroupsSplit", 0)
        text += f"; {whole}/{placement['tensorParallelGroups']} tensor-parallel groups within one domain"
    return text
