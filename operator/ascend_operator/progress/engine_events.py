"""The engine's notices (``ascend_engine.telemetry.emit_event``: a checkpoint fallback, a stack dump) as events on
the job. Rank 0 serves its recent ones at ``/events``; each is posted once, under a name made of the job's and the
event's id (unique per engine process), so a second post, from this operator or one that took over, is refused
by the API server (409) instead of duplicated."""
from __future__ import annotations

from typing import Any

from ..cache.pod_cache import JobKey
from ..client.kubeclient import kube

_POSTED: dict[JobKey, set[str]] = {}


def post_new(key: JobKey, obj: dict[str, Any], events: list[dict[str, Any]]) -> None:
    posted = _POSTED.setdefault(key, set())
    for event in events:
        if event["id"] in posted:
            continue
        kube().post_event(obj, event["reason"], event["message"], warning=event.get("type") == "Warning",
                          name=f"{obj['metadata']['name']}.{event['id']}")
        posted.add(event["id"])


def forget(key: JobKey) -> None:
    _POSTED.pop(key, None)
