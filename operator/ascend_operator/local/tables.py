"""The ``meta.k8s.io/v1`` Table a real API server returns when a client asks ``Accept: ...;as=Table``.

``kubectl get`` asks for it and prints whatever columns the server chose. A custom resource's columns come from
its CRD's ``additionalPrinterColumns`` (Name first; Name and Age when it declares none), as kube-apiserver does;
built-in kinds get the columns of kube-apiserver's own printers for the kinds a user of the local cluster looks
at (pods, events, nodes, namespaces), every other kind Name and Age.

Differs from a real API server: JSONPath in printer columns is the dotted subset (``.status.phase``,
``.status.conditions[0].type``), which is all our CRDs use.
"""
from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from .printing import jsonpath
from .resource_types import ResourceType

TABLE_MEDIA = "as=Table"
_NAME_COLUMN = {"name": "Name", "type": "string", "format": "name", "priority": 0,
                "description": "Name must be unique within a namespace."}


def wants_table(accept: str) -> bool:
    """Whether the Accept header prefers a Table (kubectl lists it first, with plain JSON as the fallback)."""
    first = accept.split(",")[0]
    return TABLE_MEDIA in first.replace(" ", "")


def _parse_time(stamp: str | None) -> datetime.datetime | None:
    if not stamp:
        return None
    try:  # metav1.Time (seconds) or MicroTime (eventTime), with Z or an offset
        then = datetime.datetime.fromisoformat(stamp)
    except ValueError:
        return None
    return then if then.tzinfo else then.replace(tzinfo=datetime.timezone.utc)


def human_age(stamp: str | None, now: datetime.datetime | None = None) -> str:
    """kube-apiserver's short duration (``45s``, ``3m12s``, ``5h``, ``2d``), ``<unknown>`` without a time."""
    then = _parse_time(stamp)
    if then is None:
        return "<unknown>"
    seconds = int(((now or datetime.datetime.now(datetime.timezone.utc)) - then).total_seconds())
    seconds = max(seconds, 0)
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    return f"{hours}h" if hours < 48 else f"{hours // 24}d"


def _column(name: str, kind: str = "string", description: str = "", priority: int = 0) -> dict[str, Any]:
    return {"name": name, "type": kind, "format": "", "description": description, "priority": priority}


def _age(obj: dict[str, Any]) -> str:
    return human_age(obj["metadata"].get("creationTimestamp"))


# -- built-in kinds: the columns kube-apiserver's printers give them ------------------------------


def _pod_status(pod: dict[str, Any]) -> str:
    """The STATUS kubectl shows: a container's waiting/terminated reason over the phase, Terminating last."""
    status = pod.get("status") or {}
    reason = status.get("reason") or status.get("phase") or "Pending"
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        if (state.get("waiting") or {}).get("reason"):
            reason = state["waiting"]["reason"]
        elif terminated := state.get("terminated"):
            reason = terminated.get("reason") or (f"Signal:{terminated['signal']}" if terminated.get("signal")
                                                  else f"ExitCode:{terminated.get('exitCode', 0)}")
    if pod["metadata"].get("deletionTimestamp"):
        reason = "Terminating"
    return reason


def _pod_row(pod: dict[str, Any]) -> list[Any]:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    containers = status.get("containerStatuses") or []
    ready = sum(1 for c in containers if c.get("ready"))
    restarts = sum(int(c.get("restartCount") or 0) for c in containers)
    return [pod["metadata"]["name"], f"{ready}/{len(spec.get('containers') or [])}", _pod_status(pod), restarts,
            _age(pod), status.get("podIP") or "<none>", spec.get("nodeName") or "<none>", "<none>", "<none>"]


_POD_COLUMNS = [
    _NAME_COLUMN, _column("Ready", description="The aggregate readiness state of this pod for accepting traffic."),
    _column("Status", description="The aggregate status of the containers in this pod."),
    _column("Restarts", "integer", "The number of times the containers in this pod have been restarted."),
    _column("Age", description="CreationTimestamp is a timestamp representing the server time when this object "
                               "was created."),
    _column("IP", description="IP address allocated to the pod.", priority=1),
    _column("Node", description="NodeName of the node the pod is scheduled on.", priority=1),
    _column("Nominated Node", priority=1), _column("Readiness Gates", priority=1),
]


def _event_row(event: dict[str, Any]) -> list[Any]:
    involved = event.get("involvedObject") or event.get("regarding") or {}
    last = event.get("lastTimestamp") or event.get("eventTime") or event["metadata"].get("creationTimestamp")
    first = event.get("firstTimestamp") or event.get("eventTime") or event["metadata"].get("creationTimestamp")
    source = event.get("source") or {}
    return [human_age(last), event.get("type") or "", event.get("reason") or "",
            f"{(involved.get('kind') or '').lower()}/{involved.get('name', '')}",
            involved.get("fieldPath") or "", source.get("component") or event.get("reportingComponent") or "",
            (event.get("message") or event.get("note") or "").strip(), human_age(first),
            int(event.get("count") or 1), event["metadata"]["name"]]


_EVENT_COLUMNS = [
    _column("Last Seen"), _column("Type"), _column("Reason"), _column("Object"),
    _column("Subobject", priority=1), _column("Source", priority=1), _column("Message"),
    _column("First Seen", priority=1), _column("Count", "integer", priority=1),
    {**_NAME_COLUMN, "priority": 1},
]


def _node_row(node: dict[str, Any]) -> list[Any]:
    ready = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), {})
    info = (node.get("status") or {}).get("nodeInfo") or {}
    state = "Ready" if ready.get("status") == "True" else "NotReady"
    if (node.get("spec") or {}).get("unschedulable"):
        state += ",SchedulingDisabled"
    return [node["metadata"]["name"], state, "<none>", _age(node), info.get("kubeletVersion") or ""]


_NODE_COLUMNS = [_NAME_COLUMN, _column("Status"), _column("Roles"), _column("Age"), _column("Version")]

_BUILTIN: dict[tuple[str, str], tuple[list[dict[str, Any]], Callable[[dict[str, Any]], list[Any]]]] = {
    ("", "pods"): (_POD_COLUMNS, _pod_row),
    ("", "events"): (_EVENT_COLUMNS, _event_row),
    ("", "nodes"): (_NODE_COLUMNS, _node_row),
    ("", "namespaces"): ([_NAME_COLUMN, _column("Status"), _column("Age")],
                         lambda ns: [ns["metadata"]["name"], (ns.get("status") or {}).get("phase", "Active"),
                                     _age(ns)]),
}
_DEFAULT = ([_NAME_COLUMN, _column("Age", description="CreationTimestamp is a timestamp representing the server "
                                                      "time when this object was created.")],
            lambda obj: [obj["metadata"]["name"], _age(obj)])


# -- custom resources: the CRD's additionalPrinterColumns -----------------------------------------


def _crd_columns(rt: ResourceType) -> tuple[list[dict[str, Any]], Callable[[dict[str, Any]], list[Any]]]:
    declared = rt.printer_columns
    if not declared:
        columns = [_NAME_COLUMN, _column("Age", "date", "CreationTimestamp of the object")]
        return columns, lambda obj: [obj["metadata"]["name"], _age(obj)]
    columns = [_NAME_COLUMN] + [
        {"name": c["name"], "type": c.get("type", "string"), "format": c.get("format", ""),
         "description": c.get("description", ""), "priority": int(c.get("priority", 0))} for c in declared]

    def cell(obj: dict[str, Any], column: dict[str, Any]) -> Any:
        value = jsonpath(obj, column["jsonPath"])  # kube-apiserver evaluates full JSONPath, filters included
        if column.get("type") == "date" and isinstance(value, str):
            return human_age(value)  # the server renders a date as an age, as kube-apiserver does
        return value

    def row(obj: dict[str, Any]) -> list[Any]:
        return [obj["metadata"]["name"]] + [cell(obj, c) for c in declared]

    return columns, row


def table(rt: ResourceType, items: list[dict[str, Any]], resource_version: str,
          include_object: str = "PartialObjectMetadata", headers: bool = True) -> dict[str, Any]:
    """The Table for ``items`` (one item for a GET of a single object, or a watch event's object; a watch sends
    the column definitions with its first event only, as kube-apiserver does)."""
    columns, row = _crd_columns(rt) if rt.crd_name else _BUILTIN.get((rt.group, rt.plural), _DEFAULT)
    rows = []
    for obj in items:
        if include_object == "Object":
            embedded: dict[str, Any] | None = obj
        elif include_object == "None":
            embedded = None
        else:
            embedded = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}
        rows.append({"cells": row(obj), "object": embedded})
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": columns if headers else None, "rows": rows}
