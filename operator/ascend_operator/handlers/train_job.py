"""AscendTrainJob: create the Service, ConfigMap and pods; keep status true to the pods and rank 0's metrics."""
from __future__ import annotations

from typing import Any

import kopf

from ..api.group import API_GROUP, API_VERSION, LABEL_JOB_KIND, LABEL_JOB_NAME, TRAIN_JOB
from ..api.train_job import AscendTrainJobSpec
from ..progress import scrape
from ..render import train_job as render
from ..settings import PROGRESS_INTERVAL
from ..status import TERMINAL, derive, now
from .common import kube, parse_spec

KIND = TRAIN_JOB.kind


@kopf.on.resume(API_GROUP, API_VERSION, TRAIN_JOB.plural)
@kopf.on.create(API_GROUP, API_VERSION, TRAIN_JOB.plural)
def ensure_job(spec, name, namespace, body, status, **_) -> None:
    """Create whatever of the job's objects is missing (idempotent: a rerun or an operator restart adds nothing)."""
    if (status or {}).get("phase") in TERMINAL:
        return
    parsed = parse_spec(AscendTrainJobSpec, KIND, namespace, name, spec, body)
    if parsed is None:
        return
    objects = render.objects(name, namespace, parsed)
    kopf.adopt(objects, owner=body)
    created = [f"{o['kind']}/{o['metadata']['name']}" for o in objects if kube().create(namespace, o)]
    if created:
        kopf.info(body, reason="Created", message=f"created {', '.join(created)}")
    reconcile(namespace, name)


@kopf.on.event("", "v1", "pods", labels={LABEL_JOB_KIND: KIND})
def pod_changed(labels, namespace, **_) -> None:
    """React to pod phase changes at once instead of waiting for the timer."""
    reconcile(namespace, labels[LABEL_JOB_NAME])


@kopf.timer(API_GROUP, API_VERSION, TRAIN_JOB.plural, interval=PROGRESS_INTERVAL, initial_delay=PROGRESS_INTERVAL)
def refresh_progress(name, namespace, status, **_) -> None:
    if (status or {}).get("phase") not in TERMINAL:
        reconcile(namespace, name)


def _rank0_progress(pods: list[dict[str, Any]], spec: AscendTrainJobSpec, name: str) -> dict[str, Any] | None:
    port = spec.train.observability.metricsPort
    rank0 = next((p for p in pods if p["metadata"]["name"] == f"{name}-0"), None)
    ip = (rank0 or {}).get("status", {}).get("podIP")
    if not port or not ip or rank0["status"].get("phase") != "Running":
        return None
    figures = scrape(f"http://{ip}:{port}/metrics")
    return {**figures, "lastUpdateTime": now()} if figures else None


def reconcile(namespace: str, name: str) -> None:
    """Recompute the job's status from its pods and rank 0's metrics; patch only what changed."""
    job = kube().get_custom(KIND, namespace, name)
    if job is None:
        return
    previous = job.get("status") or {}
    if previous.get("phase") in TERMINAL:
        return
    try:
        spec = AscendTrainJobSpec.model_validate(job["spec"])
    except ValueError:
        return  # ensure_job has already reported it
    pods = kube().list_pods(namespace, {LABEL_JOB_NAME: name, LABEL_JOB_KIND: KIND})
    status = derive(pods, spec.nnodes, previous)
    progress = _rank0_progress(pods, spec, name)
    if progress:
        status["progress"] = {**previous.get("progress", {}), **progress}
    status["observedGeneration"] = job["metadata"].get("generation")
    if status != previous:
        kube().patch_status(KIND, namespace, name, status)
        if status.get("phase") != previous.get("phase"):
            kopf.event(job, type="Warning" if status["phase"] == "Failed" else "Normal",
                       reason=status["phase"], message=status["conditions"][-1]["message"])
