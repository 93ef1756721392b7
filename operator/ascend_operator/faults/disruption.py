"""Pods that ended because the cluster took them away, not because the job failed.

Kubernetes marks such a pod with the condition ``DisruptionTarget`` (reasons PreemptionByScheduler,
DeletionByTaintManager, EvictionByEvictionAPI, DeletionByPodGC, TerminationByKubelet); a kubelet that evicts
for node pressure also sets the pod's ``status.reason`` to ``Evicted``. A Job's pod failure policy can ignore
them (action ``Ignore``: not counted against backoffLimit); the operator always does, so a run preempted ten
times by higher-priority work still restarts, and resumes from its checkpoint.
"""
from __future__ import annotations

from typing import Any

EVICTED_REASONS = ("Evicted", "Preempting")


def disruption(pod: dict[str, Any]) -> str | None:
    """Why the cluster disrupted ``pod`` (``DisruptionTarget: PreemptionByScheduler: ...``), or None."""
    status = pod.get("status") or {}
    for c in status.get("conditions") or []:
        if c.get("type") == "DisruptionTarget" and c.get("status") == "True":
            return f"DisruptionTarget: {c.get('reason', '')}: {c.get('message', '')}".rstrip(": ")
    if status.get("reason") in EVICTED_REASONS:
        return f"{status['reason']}: {status.get('message', '')}".rstrip(": ")
    return None
