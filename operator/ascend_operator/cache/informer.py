"""An informer's list-then-watch loop, one stream per watched namespace, parsed as plain JSON: list (paginated),
then watch from the list's resourceVersion; on 410 Gone (the watch fell behind the API server's window) list again,
as client-go's reflector does; on other errors back off and list again. ``synced`` is set once every namespace has
been listed. Subclasses say what to watch (``path``, ``query``) and what a listing and an event mean."""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from ..client.kubeclient import LIST_CHUNK, Kube
from ..metrics import INFORMERS_LISTING

logger = logging.getLogger(__name__)
WATCH_TIMEOUT_S = 60  # each watch request ends after this; the next resumes from the last resourceVersion


class _Gone(Exception):
    """The watch's resourceVersion is too old: list again."""


class Informer:
    what = "objects"  # for log lines

    def __init__(self, kube: Kube, namespaces: list[str]) -> None:
        self._kube = kube
        self._namespaces: list[str | None] = list(namespaces) or [None]  # None: every namespace
        self._listed_ns: set[str | None] = set()
        self.synced = threading.Event()
        self._stop = threading.Event()

    def path(self, namespace: str | None) -> str:
        raise NotImplementedError

    def query(self) -> dict[str, Any]:
        return {}

    def listed(self, namespace: str | None, items: list[dict[str, Any]]) -> None:
        """Every object of ``namespace`` as the list found them (at start-up, and after a watch expired)."""
        raise NotImplementedError

    def changed(self, kind: str, obj: dict[str, Any]) -> None:
        """One watch event: ADDED, MODIFIED or DELETED."""
        raise NotImplementedError

    def start(self) -> Informer:
        for ns in self._namespaces:
            threading.Thread(target=self._run, args=(ns,), name=f"{self.what}-informer-{ns or 'all'}",
                             daemon=True).start()
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
                logger.info("%s watch in %s expired: listing again", self.what, namespace or "all namespaces")
            except Exception as e:  # noqa: BLE001 - the API server restarting must not end the informer
                logger.warning("%s watch in %s failed (%s): listing again in %.1fs", self.what,
                               namespace or "all namespaces", e, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30)

    def _call(self, namespace: str | None, **query):
        return self._kube.request("GET", self.path(namespace), query={**self.query(), **query})

    def _list(self, namespace: str | None) -> str:
        items, token = [], None
        with INFORMERS_LISTING.track_inprogress():
            while True:
                page = json.loads(self._call(namespace, limit=LIST_CHUNK, **{"continue": token}).read())
                items.extend(page["items"])
                token = page["metadata"].get("continue")
                if not token:
                    break
            self.listed(namespace, items)
        self._listed_ns.add(namespace)
        if len(self._listed_ns) == len(self._namespaces) and not self.synced.is_set():
            logger.info("%s listed (%d in %s): reconciling", self.what, len(items), namespace or "all namespaces")
            self.synced.set()
        return page["metadata"]["resourceVersion"]

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
                    if kind != "BOOKMARK":
                        self.changed(kind, obj)
            finally:
                response.release_conn()
            if time.monotonic() - started < 1:  # a stream the server ends at once: do not spin
                self._stop.wait(1)
