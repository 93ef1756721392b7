"""The operator's jobs as last seen: every object kopf's watch delivered and every status the operator wrote, so a
reconcile starts from memory instead of a GET (an informer's store, as controller-runtime reads its cache).

Fed from two sides: the watch (kopf's events on our kinds, including the listing at start-up) and the operator's
own writes (the object a status PATCH answers with). Watch events can arrive after a write that already went
past them, so an object replaces the held one only when its resourceVersion is newer; resourceVersions are opaque
strings to clients, but every etcd-backed server (and the local one) issues increasing integers, and where one is
not an integer the object seen last wins, as in client-go's store. A held object can still be behind the server
(another client's write whose event has not arrived yet): the operator's status patches carry the resourceVersion
they were decided on, the server refuses them with 409 Conflict when it moved, and the job is then read again
(``forget``) and reconciled once more. Objects are held as delivered and never changed: readers copy what they
modify.
"""
from __future__ import annotations

import threading
from typing import Any

from .pod_cache import JobKey


def _newer(candidate: dict[str, Any], held: dict[str, Any]) -> bool:
    new, old = candidate["metadata"].get("resourceVersion"), held["metadata"].get("resourceVersion")
    try:
        return int(new) >= int(old)
    except (TypeError, ValueError):
        return True


class ObjectCache:
    def __init__(self) -> None:
        self._objects: dict[JobKey, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def observe(self, key: JobKey, obj: dict[str, Any]) -> None:
        """A watch event's or a write's object: kept unless the one held is newer (same uid)."""
        with self._lock:
            held = self._objects.get(key)
            if held is None or held["metadata"].get("uid") != obj["metadata"].get("uid") or _newer(obj, held):
                self._objects[key] = obj

    def get(self, key: JobKey) -> dict[str, Any] | None:
        return self._objects.get(key)

    def forget(self, key: JobKey) -> None:
        """Deleted, or known to be behind the server (a write refused with 409): the next read is a GET."""
        with self._lock:
            self._objects.pop(key, None)


JOBS = ObjectCache()  # every kind's jobs, by (kind, namespace, name)
