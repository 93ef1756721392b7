"""Status from what the pods say: a pure function of the pods and the previous status (unit-tested)."""
from __future__ import annotations

import datetime as dt
import json
from typing import Any

from .api.group import LABEL_REPLICA_INDEX

TERMINAL = ("Succeeded", "Failed")


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(conditions: list[dict[str, Any]], type_: str, status: str, reason: str, message: str,
                  at: str) -> list[dict[str, Any]]:
    """Upsert one condition; lastTransitionTime moves only when its status flips (Kubernetes convention)."""
    out = [dict(c) for c in conditions]
    for c in out:
        if c["type"] == type_:
            if c["status"] != status:
                c["lastTransitionTime"] = at
            c.update(status=status, reason=reason, message=message)
            return out
    out.append({"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": at})
    return out


def _index(pod: dict[str, Any]) -> int:
    return int(pod["metadata"].get("labels", {}).get(LABEL_REPLICA_INDEX, 0))


def _terminated(pod: dict[str, Any]) -> dict[str, Any]:
    for cs in pod.get("status", {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            return term
    return {}


def _waiting_reason(pod: dict[str, Any]) -> str:
    """Why a pod is not running yet, in the scheduler's or kubelet's own words."""
    st = pod.get("status", {})
    for c in st.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return f"{c.get('reason', 'Unschedulable')}: {c.get('message', '')}".strip()
    for cs in st.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting:
            return f"{waiting.get('reason', 'Waiting')}: {waiting.get('message', '')}".strip(": ")
    return "Pending"


def termination_result(pod: dict[str, Any] | None) -> dict[str, Any] | None:
    """The engine's final JSON report from a finished container's termination message."""
    message = _terminated(pod or {}).get("message")
    try:
        result = json.loads(message) if message else None
    except ValueError:
        return None  # FallbackToLogsOnError put log lines there: the engine died before reporting
    return result if isinstance(result, dict) else None


def replica_counts(pods: list[dict[str, Any]]) -> dict[str, int]:
    phases = [p.get("status", {}).get("phase", "Pending") for p in pods]
    ready = sum(1 for p in pods for c in p.get("status", {}).get("conditions") or []
                if c.get("type") == "Ready" and c.get("status") == "True")
    return {"active": phases.count("Pending") + phases.count("Running"), "ready": ready,
            "succeeded": phases.count("Succeeded"), "failed": phases.count("Failed")}


def derive(pods: list[dict[str, Any]], expected: int, previous: dict[str, Any]) -> dict[str, Any]:
    """The next status (phase, conditions, replicas, times) for a job that expects ``expected`` pods."""
    at = now()
    status = {k: v for k, v in previous.items() if k in ("conditions", "startTime", "completionTime", "restarts",
                                                         "progress", "phase")}
    conditions = status.get("conditions", [])
    status["replicas"] = counts = replica_counts(pods)
    if previous.get("phase") in TERMINAL:
        return status
    failed = sorted((p for p in pods if p.get("status", {}).get("phase") == "Failed"), key=_index)
    pods_by_phase = {ph: [p for p in pods if p.get("status", {}).get("phase", "Pending") == ph]
                     for ph in ("Pending", "Running", "Succeeded")}
    if failed:
        pod = failed[0]
        term = _terminated(pod)
        reason = "PodFailed"
        message = (f"pod {pod['metadata']['name']} failed: exit code {term.get('exitCode', '?')}"
                   f" ({term.get('reason', 'Error')})")
        phase = "Failed"
        conditions = set_condition(conditions, "Running", "False", reason, message, at)
        conditions = set_condition(conditions, "Failed", "True", reason, message, at)
        status["completionTime"] = at
    elif len(pods_by_phase["Succeeded"]) == expected:
        phase = "Succeeded"
        message = f"all {expected} pods completed"
        conditions = set_condition(conditions, "Running", "False", "JobSucceeded", message, at)
        conditions = set_condition(conditions, "Succeeded", "True", "JobSucceeded", message, at)
        status["completionTime"] = at
    elif len(pods_by_phase["Running"]) + len(pods_by_phase["Succeeded"]) == expected:
        phase = "Running"
        status.setdefault("startTime", at)
        conditions = set_condition(conditions, "Running", "True", "PodsRunning",
                                   f"{counts['ready']}/{expected} pods ready", at)
    else:
        phase = "Pending"
        waiting = sorted(pods_by_phase["Pending"], key=_index)
        missing = expected - len(pods)
        if waiting:
            message = f"{len(pods_by_phase['Running'])}/{expected} pods running; " \
                      f"{waiting[0]['metadata']['name']}: {_waiting_reason(waiting[0])}"
        else:
            message = f"{missing} of {expected} pods not created yet"
        conditions = set_condition(conditions, "Running", "False", "PodsPending", message, at)
    status["phase"] = phase
    status["conditions"] = conditions
    return status
