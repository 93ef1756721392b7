"""The Python exception line in a log ("ValueError: bad batch 7"), the one definition the engine's log watcher and
the operator's failure cause share (no torch here).

torchrun prefixes each worker's line with its rank (``[rank0]: ValueError: ...``, or ``[default0]:`` with
``--tee``); the prefix is not part of the cause. torchrun's own summary exception (``ChildFailedError``) is never the
cause: the worker's exception above it is.
"""
from __future__ import annotations

import re

_EXCEPTION_LINE = re.compile(r"^(?:\[[^\]]*\]:?\s*)?(?:[A-Za-z_][\w.]*\.)?([A-Z]\w*(?:Error|Exception|Interrupt|Exit))"
                             r"(?::\s*(.*))?$")
_LAUNCHER = ("ChildFailedError",)


def exception_line(line: str) -> str | None:
    """``"ValueError: bad batch 7"`` for such a line (with or without a rank prefix), else None."""
    m = _EXCEPTION_LINE.match(line.strip())
    if not m or m.group(1) in _LAUNCHER:
        return None
    return f"{m.group(1)}: {m.group(2)}" if m.group(2) else m.group(1)


_TORCHRUN_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)", re.MULTILINE)


def worker_exit_code(text: str | None) -> int | None:
    """The failed worker's exit code in torchrun's failure summary (``exitcode  : 17 (pid: ...)``), the root
    cause's when it names one: torchrun itself exits 1 whatever its workers exited with. None when there is none."""
    if not text:
        return None
    root = text.rfind("Root Cause")
    m = _TORCHRUN_EXITCODE.search(text, root if root >= 0 else 0) or _TORCHRUN_EXITCODE.search(text)
    return int(m.group(1)) if m else None
