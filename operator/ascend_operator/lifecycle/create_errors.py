"""What happens when the API server refuses to create a job's children (pods, Service, ConfigMap, PodGroup).

* 400 / 422 (the rendered object is invalid: a bad toleration, a volume named like one of ours, a name too
  long), or the Kubernetes client refusing the object before sending it (a toleration with an unknown key fails
  its pydantic models): trying again cannot help, so the job fails with reason ``InvalidPodTemplate`` and the
  refusal's own message (the phase change posts it as a Warning event); pods already created are deleted.
* anything else (403 from a ResourceQuota, 404 while a namespace terminates, 5xx after the client's retries):
  condition ``Created=False`` reason ``CreateFailed`` with the message, a Warning event, and the next attempt
  only after an exponential backoff (5 s doubling up to 5 min), instead of a silent retry on every sweep.
"""
from __future__ import annotations

import json
import time
from typing import Any

from kubernetes.client.rest import ApiException

from .status import set_condition

PERMANENT = (400, 422)
BACKOFF_FIRST_S, BACKOFF_MAX_S = 5.0, 300.0

class ChildCreateFailed(Exception):
    def __init__(self, what: str, error: Exception):
        super().__init__(f"creating {what}: {error}")
        self.what, self.error = what, error


_attempts: dict[tuple[str, str, str], tuple[int, float]] = {}  # job -> (failures, monotonic time of next try)


def server_message(e: ApiException) -> str:
    """The Status message of the API server's answer (the field and the reason), or its HTTP reason."""
    try:
        return json.loads(e.body or "{}").get("message") or f"{e.status} {e.reason}"
    except ValueError:
        return f"{e.status} {e.reason}"


def client_message(e: Exception) -> str:
    """A refusal by the client library itself, with the field path as the API server would write it."""
    errors = getattr(e, "errors", None)
    if not callable(errors):
        return f"the Kubernetes client refused it: {type(e).__name__}: {e}"
    found = []
    for error in errors()[:3]:
        loc = list(error.get("loc", ()))
        if loc and isinstance(loc[0], int):
            loc = loc[1:]  # the body's position among the call's arguments
        path = ""
        for part in loc:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        found.append(f"{path}: {error.get('msg')}")
    return "the Kubernetes client refused it: " + "; ".join(found)


def due(key: tuple[str, str, str]) -> bool:
    """Whether a job whose creation failed may try again now."""
    return time.monotonic() >= _attempts.get(key, (0, 0.0))[1]


def remaining(key: tuple[str, str, str]) -> float | None:
    """Seconds until a job backing off may try again (None: it is not backing off)."""
    if key not in _attempts:
        return None
    return max(0.0, _attempts[key][1] - time.monotonic())


def backoff(key: tuple[str, str, str]) -> tuple[int, float]:
    """Count one more failed attempt for ``key``: (failures so far, seconds until the next may start)."""
    failures = _attempts.get(key, (0, 0.0))[0] + 1
    delay = min(BACKOFF_FIRST_S * 2 ** (failures - 1), BACKOFF_MAX_S)
    _attempts[key] = (failures, time.monotonic() + delay)
    return failures, delay


def reset(key: tuple[str, str, str]) -> None:
    _attempts.pop(key, None)


def failed(key: tuple[str, str, str], what: str, e: Exception, status: dict[str, Any],
           at: str) -> tuple[dict[str, Any], str, bool]:
    """(new status, message, permanent) after creating ``what`` (``Pod/llm-0``) failed with ``e``."""
    refused_by_client = not isinstance(e, ApiException)
    message = f"creating {what} failed: {client_message(e) if refused_by_client else server_message(e)}"
    conditions = status.get("conditions", [])
    if refused_by_client or e.status in PERMANENT:
        _attempts.pop(key, None)
        conditions = set_condition(conditions, "Failed", "True", "InvalidPodTemplate", message, at)
        return {**status, "phase": "Failed", "conditions": conditions, "completionTime": at}, message, True
    failures, delay = backoff(key)
    message += f" (attempt {failures}; next in {delay:.0f}s)"
    conditions = set_condition(conditions, "Created", "False", "CreateFailed", message, at)
    return {**status, "conditions": conditions}, message, False
