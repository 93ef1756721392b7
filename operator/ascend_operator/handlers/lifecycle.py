"""One lifecycle for every kind: create the objects, follow the pods, read progress, keep the result.

A kind is declared once as a ``JobKind``; ``register`` wires the same three kopf handlers for it:
create/resume (idempotent creation), pod events (prompt status) and a timer (bounded-lag progress).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import kopf
from pydantic import BaseModel

from ..api.group import API_GROUP, API_VERSION, LABEL_JOB_KIND, LABEL_JOB_NAME, Kind
from ..progress import scrape
from ..settings import PROGRESS_INTERVAL
from ..status import TERMINAL, derive, now, termination_result
from .common import kube, parse_spec


@dataclass(frozen=True)
class JobKind:
    kind: Kind
    spec_model: type[BaseModel]
    replicas: Callable[[Any], int]
    render: Callable[[str, str, Any], list[dict[str, Any]]]  # (name, namespace, spec) -> objects
    metrics_port: Callable[[Any], int | None]
    progress_fields: dict[str, str]  # metric field (ascend_engine.telemetry) -> status.progress field
    result_field: str  # where rank 0's final report goes: "progress" (merged) or "outputs"


def _rank0(pods: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    return next((p for p in pods if p["metadata"]["name"] == f"{name}-0"), None)


def _live_progress(job: JobKind, spec: Any, rank0: dict[str, Any] | None) -> dict[str, Any] | None:
    port = job.metrics_port(spec)
    ip = (rank0 or {}).get("status", {}).get("podIP")
    if not port or not ip or rank0["status"].get("phase") != "Running":
        return None
    figures = scrape(f"http://{ip}:{port}/metrics")
    if not figures:
        return None
    progress = {job.progress_fields[k]: v for k, v in figures.items() if k in job.progress_fields}
    return {**progress, "lastUpdateTime": now()}


def reconcile(job: JobKind, namespace: str, name: str) -> None:
    """Recompute status from the pods and rank 0; patch only what changed; an event on each phase change."""
    obj = kube().get_custom(job.kind.kind, namespace, name)
    if obj is None:
        return
    previous = obj.get("status") or {}
    if previous.get("phase") in TERMINAL:
        return
    try:
        spec = job.spec_model.model_validate(obj["spec"])
    except ValueError:
        return  # ensure() has reported it
    pods = kube().list_pods(namespace, {LABEL_JOB_NAME: name, LABEL_JOB_KIND: job.kind.kind})
    status = derive(pods, job.replicas(spec), previous)
    rank0 = _rank0(pods, name)
    live = _live_progress(job, spec, rank0)
    if live:
        status["progress"] = {**previous.get("progress", {}), **live}
    if status["phase"] == "Succeeded":
        result = termination_result(rank0)
        if result and job.result_field == "progress":
            status["progress"] = {**status.get("progress", {}), **result, "lastUpdateTime": now()}
        elif result:
            status[job.result_field] = result
    status["observedGeneration"] = obj["metadata"].get("generation")
    if status != previous:
        kube().patch_status(job.kind.kind, namespace, name, status)
        if status["phase"] != previous.get("phase"):
            kopf.event(obj, type="Warning" if status["phase"] == "Failed" else "Normal",
                       reason=status["phase"], message=status["conditions"][-1]["message"])


def register(job: JobKind) -> None:
    kind = job.kind

    @kopf.on.resume(API_GROUP, API_VERSION, kind.plural, id=f"ensure-{kind.singular}")
    @kopf.on.create(API_GROUP, API_VERSION, kind.plural, id=f"ensure-{kind.singular}")
    def ensure(spec, name, namespace, body, status, **_) -> None:
        """Create whatever is missing; a rerun or an operator restart creates nothing twice."""
        if (status or {}).get("phase") in TERMINAL:
            return
        parsed = parse_spec(job.spec_model, kind.kind, namespace, name, spec, body)
        if parsed is None:
            return
        objects = job.render(name, namespace, parsed)
        kopf.adopt(objects, owner=body)
        created = [f"{o['kind']}/{o['metadata']['name']}" for o in objects if kube().create(namespace, o)]
        if created:
            kopf.info(body, reason="Created", message=f"created {', '.join(created)}")
        reconcile(job, namespace, name)

    @kopf.on.event("", "v1", "pods", labels={LABEL_JOB_KIND: kind.kind}, id=f"pods-of-{kind.singular}")
    def pod_changed(labels, namespace, **_) -> None:
        reconcile(job, namespace, labels[LABEL_JOB_NAME])

    @kopf.timer(API_GROUP, API_VERSION, kind.plural, interval=PROGRESS_INTERVAL, initial_delay=PROGRESS_INTERVAL,
                id=f"progress-of-{kind.singular}")
    def refresh(name, namespace, status, **_) -> None:
        if (status or {}).get("phase") not in TERMINAL:
            reconcile(job, namespace, name)
