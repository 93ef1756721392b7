"""The operator's own watch on its jobs' pods (an ``informer``), feeding ``PodCache`` and queueing the job of each
pod that changed.

kopf's per-object machinery cost about a millisecond of CPU per pod event (a task per object, a thread hop per
handler, a log line per handler); a gang restart of N pods is 2N events or more, so pods are watched here with
one stream per namespace, parsed as plain JSON. The workers wait for ``synced``, so no reconcile reads a cache
that has not seen the pods that existed before the operator started.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from ..api.group import LABEL_JOB_KIND
from .informer import Informer
from ..client.kubeclient import Kube
from ..client.permissions import uses
from .pod_cache import JobKey, PodCache, job_key

logger = logging.getLogger(__name__)


@uses("", "pods", "list")
@uses("", "pods", "watch")
class PodInformer(Informer):
    what = "pods"

    def __init__(self, kube: Kube, cache: PodCache, changed: Callable[[JobKey], None],
                 namespaces: list[str]) -> None:
        super().__init__(kube, namespaces)
        self._cache, self._queue = cache, changed

    def path(self, namespace: str | None) -> str:
        return "/api/v1/pods" if namespace is None else f"/api/v1/namespaces/{quote(namespace)}/pods"

    def query(self) -> dict[str, Any]:
        return {"labelSelector": LABEL_JOB_KIND}

    def listed(self, namespace: str | None, items: list[dict[str, Any]]) -> None:
        for key in self._cache.replace(namespace, items):
            self._queue(key)

    def changed(self, kind: str, obj: dict[str, Any]) -> None:
        if self._cache.apply(kind, obj) and kind != "ADDED":  # ADDED: our own create, already held
            key = job_key(obj)
            if key is not None:
                self._queue(key)
