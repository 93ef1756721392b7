"""The one line that says why a pod failed, from its container's termination message.

The engine writes a JSON report there (``{"status": "Failed", "message": "config.json missing in /models/x"}``);
when it died before reporting, the kubelet put the log's tail there (``FallbackToLogsOnError``), and the cause is
the last Python exception line in it (``ascend_engine.exception_line``: a torchrun rank prefix dropped, torchrun's
own ``ChildFailedError`` summary skipped).
"""
from __future__ import annotations

import json

from ascend_engine.exception_line import exception_line, worker_exit_code

MAX_CAUSE_CHARS = 400

# Megatron-LM's rerun state machine (megatron/core/rerun_state_machine.py) ends its workers with these codes.
RERUN_TO_DISAMBIGUATE_EXIT = 16  # a fault seen once: restart (elsewhere) and re-run the step to tell transient from not
RERUN_VALIDATION_FAILED_EXIT = 17  # the re-run reproduced it (or the check failed for good): a numeric fault
RERUN_REQUESTED = "RerunRequested"
NUMERIC_FAULT = "NumericFault"  # also the engine's own reason when train.numerics runs out of rollbacks


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


def numeric_failure(exit_code: int | None, report: dict, message: str | None) -> tuple[bool, str, str] | None:
    """(retryable, reason, why) when a pod ended on a numeric fault: the engine's NumericFault report (train.numerics
    out of rollbacks), or Megatron's rerun state machine's exit code, the container's own or its torchrun worker's
    (from the log tail, or from ``ascend-engine watch``'s report of a trainer's output). None otherwise."""
    if report.get("reason") == NUMERIC_FAULT:
        return False, NUMERIC_FAULT, str(report.get("message") or "numeric fault")
    codes = [exit_code, report.get("workerExitCode"), None if report else worker_exit_code(message)]
    if RERUN_VALIDATION_FAILED_EXIT in codes:
        return False, NUMERIC_FAULT, (f"exit code {RERUN_VALIDATION_FAILED_EXIT}: Megatron's rerun state machine "
                                      "found a reproducible numeric fault (result validation failed); permanent")
    if RERUN_TO_DISAMBIGUATE_EXIT in codes:
        return True, RERUN_REQUESTED, (f"exit code {RERUN_TO_DISAMBIGUATE_EXIT}: Megatron's rerun state machine asked "
                                       "for a restart to re-run a faulty step (not counted against "
                                       "runPolicy.backoffLimit)")
    return None
