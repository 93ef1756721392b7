"""``runPolicy``: what the operator does when pods fail, run too long, finish, or the job is suspended.

The decisions themselves are small pure methods here, so they are unit-tested without a cluster.
"""
from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from pydantic import Field

from ascend_engine.rendezvous import MASTER_UNREACHABLE_EXIT  # noqa: F401  (re-exported for status.py)

from .kube import KubeModel


def parse_time(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)


class RunPolicy(KubeModel):
    """Restarts, deadlines, clean-up and suspension (the training operator's RunPolicy, plus exit-code rules)."""

    backoffLimit: Annotated[int, Field(ge=0, le=1000)] = 3
    """Gang restarts allowed after retryable failures: all pods are deleted and created anew together, and
    training resumes from its latest checkpoint (checkpoint.load defaults to checkpoint.save)."""
    retryableExitCodes: list[Annotated[int, Field(ge=1, le=255)]] = []
    """Exit codes in 1-127 that should also restart the job. 128 and above (killed by a signal: OOM kill,
    node loss, preemption) are always retryable; other codes in 1-127 are permanent and fail at once."""
    activeDeadlineSeconds: Annotated[int | None, Field(ge=1)] = None
    """Fail the job (reason DeadlineExceeded) when it has had pods for longer than this; suspended time
    does not count."""
    ttlSecondsAfterFinished: Annotated[int | None, Field(ge=0)] = None
    """Delete the finished job (and, by owner references, everything it created) this long after it ended."""
    cleanPodPolicy: Literal["All", "Running", "None"] = "Running"
    """Pods to delete when the job ends: All, Running (pods still pending or running: no zombies left
    holding devices) or None (keep every pod for inspection)."""
    suspend: bool = False
    """Remove the pods and keep the job (phase Suspended); setting it back to false recreates them and
    training resumes from its checkpoint. Kueue admits jobs by flipping this field."""

    def is_retryable(self, exit_code: int | None) -> bool:
        """Signals (128+) and listed codes restart the gang; an unknown code (pod evicted, node lost) too."""
        if exit_code is None or exit_code >= 128:
            return True
        return exit_code in self.retryableExitCodes

    def deadline_passed(self, active_since: str | None, at: dt.datetime) -> bool:
        if self.activeDeadlineSeconds is None or not active_since:
            return False
        return (at - parse_time(active_since)).total_seconds() > self.activeDeadlineSeconds

    def ttl_expired(self, completion_time: str | None, at: dt.datetime) -> bool:
        if self.ttlSecondsAfterFinished is None or not completion_time:
            return False
        return (at - parse_time(completion_time)).total_seconds() >= self.ttlSecondsAfterFinished

    def pods_to_clean(self, pods: list[dict]) -> list[dict]:
        """The pods to delete once the job has ended."""
        if self.cleanPodPolicy == "All":
            return list(pods)
        if self.cleanPodPolicy == "Running":
            return [p for p in pods if (p.get("status") or {}).get("phase", "Pending") in ("Pending", "Running")]
        return []
