"""Kueue's contract for a job it queues: the job exists suspended until Kueue admits it by setting
``spec.runPolicy.suspend`` to false, and is suspended again (pods deleted, checkpoint kept) when Kueue preempts it.

Kueue's webhook suspends the kinds it integrates at creation; for ours the operator does it: the first time it
sees a job labelled ``kueue.x-k8s.io/queue-name`` (no status yet) with ``suspend: false``, it sets ``suspend: true``
before creating anything. An operator restart does not suspend a job Kueue has already admitted (it has a
status by then). The queue label stays off the pods (Kueue's pod integration would otherwise queue each pod on
its own; kopf.adopt copies the job's labels to its children, ``keep_off_children`` takes Kueue's off again);
``priorityClassName`` and the gang PodGroup are created only once the job is admitted.
"""
from __future__ import annotations

from typing import Any

from .common import kube

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def suspend_until_admitted(kind: str, obj: dict[str, Any], suspended: bool) -> bool:
    """Suspend a queued job on first sight; True when it did (the spec change brings the next reconcile)."""
    meta = obj["metadata"]
    if suspended or QUEUE_LABEL not in (meta.get("labels") or {}) or (obj.get("status") or {}).get("phase"):
        return False
    kube().patch_custom(kind, meta["namespace"], meta["name"], {"spec": {"runPolicy": {"suspend": True}}})
    kube().post_event(obj, "Suspended", f"queued in Kueue LocalQueue {meta['labels'][QUEUE_LABEL]}: suspended "
                                        "until Kueue admits it (sets spec.runPolicy.suspend to false)")
    return True


def keep_off_children(objects: list[dict[str, Any]]) -> None:
    """Drop Kueue's labels from the objects a job creates: only the job itself is a Kueue workload."""
    for obj in objects:
        labels = obj["metadata"].get("labels") or {}
        for key in [k for k in labels if k.startswith("kueue.x-k8s.io/")]:
            del labels[key]
