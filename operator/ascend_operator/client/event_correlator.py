"""Repeated events become one Event with a count, as client-go's EventRecorder makes them.

client-go's correlator keys an event on its source, involved object, type, reason and message; the first one is
created, each repeat PATCHes that Event's ``count``, ``lastTimestamp`` and ``message`` (so ``kubectl get events``
shows one row, LAST SEEN the latest, COUNT how many), and an Event that expired or was deleted in between is
created again. The cache is per process and bounded (LRU, client-go's 4096 entries): a new leader starts counting
anew, as a restarted controller-manager does.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Hashable

CACHE_SIZE = 4096  # client-go's maxLruCacheEntries


@dataclass
class Seen:
    name: str
    count: int
    first: str


class EventCorrelator:
    """``record`` creates or bumps; ``create(body)`` and ``patch(namespace, name, patch)`` do the requests and
    raise ``LookupError`` from ``patch`` when the Event is gone (404)."""

    def __init__(self, create: Callable[[dict[str, Any]], None],
                 patch: Callable[[str, str, dict[str, Any]], None]) -> None:
        self._create, self._patch = create, patch
        self._seen: OrderedDict[Hashable, Seen] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(body: dict[str, Any]) -> Hashable:
        involved = body["involvedObject"]
        return (body["source"].get("component"), involved.get("kind"), involved["namespace"], involved["name"],
                involved.get("uid"), body["type"], body["reason"], body["message"])

    def record(self, body: dict[str, Any]) -> None:
        """Create the event, or bump the count of the one this process made for the same key. The requests go
        out of the lock (a reconcile worker never waits on another's request); the count is claimed under it,
        so two repeats at once bump it to n+1 and n+2, and the later PATCH leaves the higher one."""
        key, at = self.key(body), body["lastTimestamp"]
        with self._lock:
            seen = self._seen.get(key)
            if seen is None:
                self._seen[key] = Seen(body["metadata"]["name"], body["count"], body["firstTimestamp"])
                while len(self._seen) > CACHE_SIZE:
                    self._seen.popitem(last=False)
            else:
                self._seen.move_to_end(key)
                seen.count += 1
                count, name, first = seen.count, seen.name, seen.first
        if seen is None:
            try:
                self._create(body)
            except BaseException:
                with self._lock:
                    self._seen.pop(key, None)
                raise
            return
        try:
            self._patch(body["metadata"]["namespace"], name,
                        {"count": count, "lastTimestamp": at, "message": body["message"]})
        except LookupError:  # expired (events live an hour on a real cluster) or deleted: create it again
            self._create({**body, "firstTimestamp": first, "count": count})
            with self._lock:
                if key in self._seen:
                    self._seen[key].name = body["metadata"]["name"]
