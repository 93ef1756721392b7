"""The operator's own watch on its jobs' pods (an informer: list, then watch from the list's resourceVersion),
feeding ``PodCache`` and queueing the job of each pod that changed.

kopf's per-object machinery cost about a millisecond of CPU per pod event (a task per object, a thread hop per
handler, a log line per handler); a gang restart of N pods is 2N events or more, so pods are watched here with
one stream per namespace, parsed as plain JSON. Jobs stay kopf's (one event per job, not per pod). On 410 Gone
(the watch fell behind the API server's window) it lists again, as client-go's reflector does; on other errors
it backs off and lists again. ``synced`` is set once every namespace has been listed: the workers wait for it,
so no reconcile reads a cache that has not seen the pods that existed before the operator started.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from urllib.parse import quote

from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from .api.group import LABEL_JOB_KIND
from .kubeclient import LIST_CHUNK, Kube
from .permissions import uses
from .pod_cache import JobKey, PodCache, job_key

logger = logging.getLogger(__name__)
WATCH_TIMEOUT_S = 60  # each watch request ends after this; the next resumes from the last resourceVersion


class _Gone(Exception):
    """The watch's resourceVersion is too old: list again."""


class PodInformer:
    def __init__(self, kube: Kube, cache: PodCache, changed: Callable[[JobKey], None],
                 namespaces: list[str]) -> None:
        self._kube, self._cache, self._changed = kube, cache, changed
        self._namespaces: list[str | None] = list(namespaces) or [None]  # None: every namespace
        self._listed: set[str | None] = set()
        self.synced = threading.Event()
        self._stop = threading.Event()

    def start(self) -> PodInformer:
        for ns in self._namespaces:
            threading.Thread(target=self._run, args=(ns,), name=f"pod-informer-{ns or 'all'}", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self, namespace: str | None) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                rv = self._list(namespace)
                backoff = 0.5
                self._watch(namespace, rv)
            except _Gone:
                logger.info("pod watch in %s expired: listing again", namespace or "all namespaces")
            except Exception as e:  # noqa: BLE001 - the API server restarting must not end the informer
                logger.warning("pod watch in %s failed (%s): listing again in %.1fs", namespace or "all namespaces",
                               e, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30)

    def _call(self, namespace: str | None, **query):
        path = "/api/v1/pods" if namespace is None else f"/api/v1/namespaces/{quote(namespace)}/pods"
        return self._kube.request("GET", path, query={"labelSelector": LABEL_JOB_KIND, **query})

    @uses("", "pods", "list")
    def _list(self, namespace: str | None) -> str:
        items, token = [], None
        while True:
            page = json.loads(self._call(namespace, limit=LIST_CHUNK, **{"continue": token}).read())
            items.extend(page["items"])
            token = page["metadata"].get("continue")
            if not token:
                break
        for key in self._cache.replace(namespace, items):
            self._changed(key)
        self._listed.add(namespace)
        if len(self._listed) == len(self._namespaces) and not self.synced.is_set():
            logger.info("pods listed (%d in %s): reconciling", len(items), namespace or "all namespaces")
            self.synced.set()
        return page["metadata"]["resourceVersion"]

    @uses("", "pods", "watch")
    def _watch(self, namespace: str | None, rv: str) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            response = self._call(namespace, watch="true", resourceVersion=rv, timeoutSeconds=WATCH_TIMEOUT_S,
                                  allowWatchBookmarks="true").response
            try:
                for line in iter_resp_lines(response):
                    event = json.loads(line)
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            raise _Gone()
                        raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                    rv = obj["metadata"]["resourceVersion"]
                    if kind == "BOOKMARK":
                        continue
                    if self._cache.apply(kind, obj) and kind != "ADDED":  # ADDED: our own create, already held
                        key = job_key(obj)
                        if key is not None:
                            self._changed(key)
            finally:
                response.release_conn()
            if time.monotonic() - started < 1:  # a stream the server ends at once: do not spin
                self._stop.wait(1)
