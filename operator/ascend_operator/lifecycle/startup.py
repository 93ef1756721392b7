"""kopf settings, the operator's metrics endpoint and the periodic sweep over live jobs."""
from __future__ import annotations

import asyncio
import logging

import kopf

from .. import metrics
from ..api.group import API_GROUP
from ..dashboard.server import serve as serve_dashboard
from ..client.kubeclient import LIST_CHUNK, STOPPING
from ..client.kubeclient import kube
from ..settings import DASHBOARD_PORT, METRICS_PORT
from . import workers

_sweep: dict[str, object] = {}
_servers: list = []  # the dashboard's HTTP server, shut down with the operator


class NoDiffBase(kopf.DiffBaseStorage):
    """No last-handled state: kopf builds an object's essence on every watch event (a deep copy of the whole
    spec, and another to clear it of its own annotations) for change-detecting handlers (``on.create``,
    ``on.update``, ``on.resume``) to diff against. This operator has none: a job's ``on.event`` handler queues
    its key and the reconcile reads the object itself, so the copies were a quarter of the operator's CPU while
    500 jobs were applied at once, for nothing."""

    def build(self, *, body: kopf.Body, extra_fields: object = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        raise RuntimeError("a change-detecting kopf handler needs a diff base: set "
                           "kopf.AnnotationsDiffBaseStorage in lifecycle/startup.py again")


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, **_) -> None:
    # Keep kopf's own bookkeeping in annotations: our status schema is structural and would prune a
    # `status.kopf` block, and status belongs to the user-facing contract.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.posting.level = 20  # INFO and above become Kubernetes events
    settings.execution.max_workers = 16  # kopf's threads run the handlers, which only feed the queue and cache
    settings.watching.chunk_size = LIST_CHUNK  # kopf's own listings paginate (limit/continue) as ours do
    metrics.serve(METRICS_PORT)
    if DASHBOARD_PORT:
        try:
            _servers.append(serve_dashboard(kube().api, DASHBOARD_PORT))
        except OSError as e:  # like the metrics port: the jobs matter more than the page
            logging.getLogger(__name__).error("dashboard not served on port %d: %s", DASHBOARD_PORT, e)
    workers.start()
    stop = asyncio.Event()
    # The sweep queues live jobs every PROGRESS_INTERVAL; created here so that it stops with kopf.
    _sweep.update(stop=stop, task=asyncio.create_task(workers.sweep_forever(stop)))


@kopf.on.cleanup()
async def stop_sweeping(**_) -> None:
    STOPPING.set()  # in-flight reconciles stop retrying; queued ones return at once
    while _servers:
        _servers.pop().shutdown()
    if _sweep:
        _sweep["stop"].set()  # type: ignore[attr-defined]
        await _sweep["task"]  # type: ignore[misc]
    await asyncio.to_thread(workers.stop)  # a reconcile under way finishes; queued ones are dropped
