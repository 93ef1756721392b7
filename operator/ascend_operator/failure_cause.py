"""The one line that says why a pod failed, from its container's termination message.

The engine writes a JSON report there (``{"status": "Failed", "message": "config.json missing in /models/x"}``);
when it died before reporting, the kubelet put the log's tail there (``FallbackToLogsOnError``), and the cause is
the last Python exception line in it (``ascend_engine.exception_line``: a torchrun rank prefix dropped, torchrun's
own ``ChildFailedError`` summary skipped).
"""
from __future__ import annotations

import json

from ascend_engine.exception_line import exception_line

MAX_CAUSE_CHARS = 400


def failure_cause(message: str | None) -> str:
    """The cause in a termination message, or "" when it holds none (figures only, or nothing)."""
    if not message:
        return ""
    try:
        report = json.loads(message)
    except ValueError:
        report = None
    if isinstance(report, dict):
        text = str(report.get("message") or "") if report.get("status") == "Failed" else ""
        return _shorten("; ".join(line.strip() for line in text.splitlines() if line.strip()))
    for line in reversed(message.splitlines()):
        if cause := exception_line(line):
            return _shorten(cause)
    return ""


def _shorten(text: str) -> str:
    return text if len(text) <= MAX_CAUSE_CHARS else text[:MAX_CAUSE_CHARS - 3] + "..."
