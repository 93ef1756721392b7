"""Attempts: each gang (re)start of a job creates its pods under new names, so the pods of a failed attempt, and
their logs, stay until the job is deleted (or ``runPolicy.cleanPodPolicy`` says otherwise), as a batch/v1 Job keeps
its failed pods.

A pod is named ``<job>-<index>-<attempt>`` and labelled with its attempt and replica index; its stable identity
is not its name but ``hostname: <job>-<index>`` + ``subdomain: <job>`` on the headless Service, as in an Indexed
Job, so ``MASTER_ADDR`` (``<job>-0.<job>.<ns>.svc``) is the same for every attempt. The attempt number is the
job's gang restarts plus its elastic resizes (``status.restarts + status.elastic.resizes``): both grow by one
per new gang and neither ever shrinks, so the number needs no status field of its own.

Only the current attempt's pods decide the status (``status.derive``), readiness and progress. A gang restart
stops the older attempts' pods that still run or wait (deleted, with their grace period: Kubernetes has no way to
stop a pod and keep it), and keeps those that ended, failed or succeeded; the pods of attempts older than the
newest ``kept(backoffLimit)`` are deleted (``lifecycle.pod_ends.doomed``), so a job never holds more than that
many.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..api.group import LABEL_ATTEMPT, LABEL_REPLICA_INDEX

FINISHED = ("Succeeded", "Failed")


def current(status: dict[str, Any]) -> int:
    """The attempt the job's pods are created for now."""
    return int(status.get("restarts") or 0) + int((status.get("elastic") or {}).get("resizes") or 0)


def of(pod: dict[str, Any]) -> int:
    """A pod's attempt (0 for a pod labelled before attempts existed)."""
    return int(((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_ATTEMPT, 0))


def pod_name(job: str, index: int, attempt: int) -> str:
    return f"{job}-{index}-{attempt}"


def stamp(objects: Iterable[dict[str, Any]], job: str, attempt: int) -> None:
    """Name and label the rendered pods (named by their index alone) for ``attempt``."""
    for o in objects:
        if o["kind"] == "Pod":
            labels = o["metadata"].setdefault("labels", {})
            labels[LABEL_ATTEMPT] = str(attempt)
            o["metadata"]["name"] = pod_name(job, int(labels.get(LABEL_REPLICA_INDEX, 0)), attempt)


def kept(backoff_limit: int) -> int:
    """How many attempts keep their pods: one per restart runPolicy.backoffLimit allows plus the first, and at
    least two (the current one and the one before it, whose failure a restart not counted against backoffLimit,
    such as a disruption, answers)."""
    return max(backoff_limit + 1, 2)
