"""The operator's own Prometheus metrics: jobs by kind and phase, gang restarts by reason, stalls, recoveries by
level, training jobs' goodput, reconcile latency, API errors.

Served on ``settings.METRICS_PORT`` by ``serve`` (called once at operator start-up).
"""
from __future__ import annotations

import logging
import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY = CollectorRegistry()

JOBS = Gauge("ascend_operator_jobs", "Jobs the operator follows, by kind and phase", ["kind", "phase"],
             registry=REGISTRY)
RESTARTS = Counter("ascend_operator_gang_restarts", "Gang restarts ordered, by the Restarting condition's reason "
                   "(PodFailed, PodDeleted, PodDisrupted, Preempted, MasterUnreachable, Stalled)", ["kind", "reason"],
                   registry=REGISTRY)
STALLS = Counter("ascend_operator_stalls", "Jobs declared Stalled (the iteration stopped advancing)", ["kind"],
                 registry=REGISTRY)
RESIZES = Counter("ascend_operator_elastic_resizes", "Elastic jobs restarted at another size, by reason (ScaledIn, "
                  "ScaledOut)", ["kind", "reason"], registry=REGISTRY)
RECONCILE_SECONDS = Histogram("ascend_operator_reconcile_seconds", "Time to reconcile one job", ["kind"],
                              buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=REGISTRY)
RECOVERIES = Counter("ascend_operator_recoveries", "Recoveries by the level of the ladder that handled them "
                     "(InPlace, Replace, Resize; status.recoveries)", ["kind", "level"], registry=REGISTRY)
GOODPUT = Gauge("ascend_operator_job_goodput", "A training job's productive training time over its wall time "
                "(status.goodput.goodput)", ["namespace", "name"], registry=REGISTRY)
WORKQUEUE_DEPTH = Gauge("ascend_operator_workqueue_depth", "Jobs waiting for a reconcile or being reconciled (0: "
                        "the operator has caught up with every event it has seen)", registry=REGISTRY)
INFORMERS_LISTING = Gauge("ascend_operator_informers_listing", "Informers listing their objects (at start-up, and "
                          "after a watch expired): what changed meanwhile is not in the work queue yet",
                          registry=REGISTRY)
API_ERRORS = Counter("ascend_operator_api_errors", "Kubernetes API calls that failed, by HTTP status",
                     ["code"], registry=REGISTRY)

_phases: dict[tuple[str, str, str], str] = {}  # (kind, namespace, name) -> phase
_lock = threading.Lock()


def job_phase(kind: str, namespace: str, name: str, phase: str | None) -> None:
    """Record a job's phase (None: the job is gone) and refresh the per-phase gauge."""
    with _lock:
        key = (kind, namespace, name)
        old = _phases.pop(key, None)
        if phase:
            _phases[key] = phase
        if old == phase:
            return
        if old:
            JOBS.labels(kind, old).dec()
        if phase:
            JOBS.labels(kind, phase).inc()


def serve(port: int) -> None:
    """Serve /metrics; a port already taken is logged, not fatal (the operator's work matters more)."""
    if not port:
        return
    try:
        start_http_server(port, registry=REGISTRY)
    except OSError as e:
        logging.getLogger(__name__).error("operator metrics not served on port %d: %s", port, e)


def recoveries(kind: str, namespace: str, name: str, before: dict, after: dict) -> None:
    """Count the recoveries ``after`` opened (by their start time) and refresh the job's goodput gauge."""
    seen = {r["time"] for r in before.get("recoveries") or []}
    for r in after.get("recoveries") or []:
        if r["time"] not in seen:
            RECOVERIES.labels(kind, r["level"]).inc()
    ratio = (after.get("goodput") or {}).get("goodput")
    if ratio is not None:
        GOODPUT.labels(namespace, name).set(ratio)


def forget_job(namespace: str, name: str) -> None:
    try:
        GOODPUT.remove(namespace, name)
    except KeyError:
        pass
