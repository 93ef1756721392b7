"""What happens when the API server refuses to create a job's children (pods, Service, ConfigMap, PodGroup).

* 400 / 422 (the rendered object is invalid: a bad toleration, a volume named like one of ours, a name too
  long): trying again cannot help, so the job fails with reason ``InvalidPodTemplate`` and the server's own
  message (the phase change posts it as a Warning event); pods already created are deleted.
* anything else (403 from a ResourceQuota, 404 while a namespace terminates, 5xx after the client's retries):
  condition ``Created=False`` reason ``CreateFailed`` with the message, a Warning event, and the next attempt
  only after an exponential backoff (5 s doubling up to 5 min), instead of a silent retry on every sweep.
"""
from __future__ import annotations

import json
import time
from typing import Any

from kubernetes.client.rest import ApiException

from ..status import set_condition

PERMANENT = (400, 422)
BACKOFF_FIRST_S, BACKOFF_MAX_S = 5.0, 300.0

class ChildCreateFailed(Exception):
    def __init__(self, what: str, error: ApiException):
        super().__init__(f"creating {what}: {error.status}")
        self.what, self.error = what, error


_attempts: dict[tuple[str, str, str], tuple[int, float]] = {}  # job -> (failures, monotonic time of next try)


def server_message(e: ApiException) -> str:
    """The Status message of the API server's answer (the field and the reason), or its HTTP reason."""
    try:
        return json.loads(e.body or "{}").get("message") or f"{e.status} {e.reason}"
    except ValueError:
        return f"{e.status} {e.reason}"


def due(key: tuple[str, str, str]) -> bool:
    """Whether a job whose creation failed may try again now."""
    return time.monotonic() >= _attempts.get(key, (0, 0.0))[1]


def reset(key: tuple[str, str, str]) -> None:
    _attempts.pop(key, None)


def failed(key: tuple[str, str, str], what: str, e: ApiException, status: dict[str, Any],
           at: str) -> tuple[dict[str, Any], str, bool]:
    """(new status, message, permanent) after creating ``what`` (``Pod/llm-0``) failed with ``e``."""
    message = f"creating {what} failed: {server_message(e)}"
    conditions = status.get("conditions", [])
    if e.status in PERMANENT:
        _attempts.pop(key, None)
        conditions = set_condition(conditions, "Failed", "True", "InvalidPodTemplate", message, at)
        return {**status, "phase": "Failed", "conditions": conditions, "completionTime": at}, message, True
    failures = _attempts.get(key, (0, 0.0))[0] + 1
    delay = min(BACKOFF_FIRST_S * 2 ** (failures - 1), BACKOFF_MAX_S)
    _attempts[key] = (failures, time.monotonic() + delay)
    message += f" (attempt {failures}; next in {delay:.0f}s)"
    conditions = set_condition(conditions, "Created", "False", "CreateFailed", message, at)
    return {**status, "conditions": conditions}, message, False
