"""The operator's own watch on one of its kinds (an ``informer``), in place of kopf's: each event is one JSON
line handed to ``seen``; the listing (at start-up, and after a watch expired) hands every object with type None,
as kopf's did, and a DELETED for each object that vanished while no watch was open.

kopf spent about 3 ms of CPU on each job event (a task and a batching window per object, a thread hop per
handler, its logging), twice a new job (its creation, then the status the operator writes): a fifth of the
operator's CPU when 500 jobs are applied at once. kopf still runs the operator's start-up and clean-up.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from ..api.group import API_GROUP, API_VERSION, Kind
from .informer import Informer
from ..client.kubeclient import Kube
from ..client.permissions import uses_on_kinds


@uses_on_kinds("", "list", "watch")
class JobInformer(Informer):
    def __init__(self, kube: Kube, kind: Kind, namespaces: list[str],
                 seen: Callable[[str | None, dict[str, Any]], None]) -> None:
        super().__init__(kube, namespaces)
        self.what, self._kind, self._seen = kind.plural, kind, seen
        self._names: set[tuple[str, str]] = set()  # (namespace, name) of the objects seen and not deleted

    def path(self, namespace: str | None) -> str:
        base = f"/apis/{API_GROUP}/{API_VERSION}"
        return f"{base}/{self._kind.plural}" if namespace is None else \
            f"{base}/namespaces/{quote(namespace)}/{self._kind.plural}"

    def listed(self, namespace: str | None, items: list[dict[str, Any]]) -> None:
        now = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in items}
        for ns, name in sorted(n for n in self._names - now if namespace is None or n[0] == namespace):
            self.changed("DELETED", {"metadata": {"namespace": ns, "name": name}})
        for obj in items:
            self._names.add((obj["metadata"]["namespace"], obj["metadata"]["name"]))
            self._seen(None, obj)

    def changed(self, kind: str, obj: dict[str, Any]) -> None:
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        if kind == "DELETED":
            self._names.discard(key)
        else:
            self._names.add(key)
        self._seen(kind, obj)
