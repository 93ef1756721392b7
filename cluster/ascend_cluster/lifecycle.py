"""Which process runs the local cluster on a root, and stopping it from another shell (``local down``)."""
from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

PID_FILE = "local-up.pid"
STOP_WAIT_S = 60.0


def running_pid(root: Path) -> int | None:
    """The pid of the live ``local up`` on ``root``, or None (no file, or a stale one from a killed process)."""
    try:
        pid = int((root / PID_FILE).read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of the caller (tests start `local up` themselves) has stopped too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


@contextlib.contextmanager
def pid_file(root: Path) -> Iterator[None]:
    path = root / PID_FILE
    path.write_text(f"{os.getpid()}\n")
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def stop(root: Path, wait_s: float = STOP_WAIT_S) -> int | None:
    """SIGTERM the ``local up`` on ``root`` and wait until it has stopped (saved its state); its pid, or None."""
    pid = running_pid(root)
    if pid is None:
        return None
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while _alive(pid):  # the process, not its pid file: it saves the cluster's state after removing the file
        if time.monotonic() > deadline:
            raise TimeoutError(f"pid {pid} did not stop within {wait_s:.0f}s")
        time.sleep(0.1)
    return pid

