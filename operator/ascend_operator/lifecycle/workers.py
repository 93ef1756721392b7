"""What runs the reconcile: the informers that queue a job's key when it or its pods change, the shared pool of
workers that serves the queue (one reconcile per job at a time, as controller-runtime's), and the sweep that
queues live jobs every PROGRESS_INTERVAL for what no event announces (progress, deadlines, TTLs, dependencies,
a create's backoff). No per-object kopf timer, hence no finalizer on the jobs: deleting one never waits for the
operator."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from .. import metrics
from ..cache.informer import Informer
from ..cache.job_informer import JobInformer
from ..cache.object_cache import JOBS
from ..cache.pod_cache import JobKey
from ..cache.pod_informer import PodInformer
from ..cache.workqueue import WorkQueue, Workers
from ..client.kubeclient import STOPPING, ShuttingDown, kube
from ..kueue import integration as kueue
from ..settings import PROGRESS_INTERVAL, RECONCILE_WORKERS
from . import create_errors, reconcile as lifecycle
from .kinds import KINDS, JobKind
from .status import TERMINAL

logger = logging.getLogger(__name__)

WATCHED_NAMESPACES: list[str] = []  # set by ``main`` from --namespace; empty: the whole cluster
_workers: list[Workers] = []
_informers: list[Informer] = []  # the pods' first: the workers wait until it has listed


def _process(key: JobKey) -> None:
    kind, namespace, name = key
    if kind not in KINDS:
        return
    if _informers and not _informers[0].synced.wait(60):
        logger.warning("pods not listed yet: reconciling %s %s/%s from a listing of its own", kind, namespace, name)
    try:
        lifecycle.reconcile(KINDS[kind], namespace, name)
    except ShuttingDown:
        pass
    except Exception as e:  # noqa: BLE001 - backed off and reported; the sweep queues it again when due
        _reconcile_failed(KINDS[kind], namespace, name, e)


def synced() -> bool:
    """Whether every informer has listed its objects once (readiness: the reconciles read a whole cache)."""
    return bool(_informers) and all(informer.synced.is_set() for informer in _informers)


def start() -> None:
    """The pod informer, each kind's informer, Kueue's Workloads and the shared pool that serves the queue (started
    with the operator, in kopf's start-up handler; the workers wait until the pods are listed)."""
    if _workers:
        return
    if not lifecycle.QUEUE.accepting:
        lifecycle.QUEUE = WorkQueue()
    queue = lambda key: lifecycle.QUEUE.add(key)  # noqa: E731  (the queue in place when the event comes)
    _informers.append(PodInformer(kube(), lifecycle.PODS, queue, WATCHED_NAMESPACES).start())
    for job in KINDS.values():
        _informers.append(JobInformer(kube(), job.kind, WATCHED_NAMESPACES,
                                      lambda type, obj, job=job: _job_seen(job, type, obj)).start())
    _informers.append(kueue.start(kube(), list(KINDS), WATCHED_NAMESPACES, queue))
    _workers.append(Workers(lifecycle.QUEUE, _process, RECONCILE_WORKERS).start())
    metrics.WORKQUEUE_DEPTH.set_function(lambda: lifecycle.QUEUE.unfinished())


def stop() -> None:
    while _informers:
        _informers.pop().stop()
    while _workers:
        _workers.pop().stop()


SWEEP_TICK_S = 0.5


async def sweep_forever(stop_: asyncio.Event) -> None:
    """Queue each job whose next pass is due (``reconcile._due``: a running job's progress every
    PROGRESS_INTERVAL, a deadline, a TTL, a backoff); a job waiting for events is not touched, so idle jobs cost
    nothing however many there are."""
    while not stop_.is_set() and not STOPPING.is_set():
        try:
            await asyncio.wait_for(stop_.wait(), timeout=min(SWEEP_TICK_S, PROGRESS_INTERVAL))
            return
        except asyncio.TimeoutError:
            pass
        now = time.monotonic()
        for key, due in list(lifecycle.DUE.items()):
            if due <= now:
                lifecycle.DUE.pop(key, None)  # the pass schedules the next one
                lifecycle.QUEUE.add(key)


def _reconcile_failed(job: JobKind, namespace: str, name: str, error: Exception) -> None:
    """A reconcile that raised (the API server refusing a status patch, a pod list timing out) is tried again by
    the sweep only after a capped exponential backoff, and says so in a Warning event instead of a log line every
    sweep."""
    failures, delay = create_errors.backoff((job.kind.kind, namespace, name))
    lifecycle.DUE[(job.kind.kind, namespace, name)] = time.monotonic() + delay
    message = f"reconciling failed (attempt {failures}; next in {delay:.0f}s): {type(error).__name__}: {error}"
    logger.warning("%s %s/%s: %s", job.kind.kind, namespace, name, message)
    try:
        obj = kube().get_custom(job.kind.kind, namespace, name)
        if obj is not None:
            kube().post_event(obj, "ReconcileFailed", message, True)
    except Exception as e:  # the API server itself may be what failed
        logger.warning("no event for %s %s/%s: %s", job.kind.kind, namespace, name, e)


def _job_seen(job: JobKind, type: str | None, obj: dict[str, Any]) -> None:
    """New objects, spec changes and the listing (type None); our own status patches are only remembered."""
    namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    key = (job.kind.kind, namespace, name)
    if type == "DELETED":
        lifecycle.forget(job, namespace, name)
        if lifecycle.PODS.holds(key):  # pods still carrying the finalizer: the reconcile of the gone job releases them
            lifecycle.QUEUE.add(key)
        return
    JOBS.observe(key, obj)
    status = obj.get("status") or {}
    if status.get("phase") in TERMINAL and type is not None and \
            obj["metadata"].get("generation") == status.get("observedGeneration"):
        return  # a finished job's own status writes; a runPolicy change (its TTL) is taken and recorded
    if type in (None, "ADDED") or obj["metadata"].get("generation") != status.get("observedGeneration"):
        lifecycle.QUEUE.add(key)
