"""Every thread's Python stack on demand: ``kill -USR1 <pid>`` makes an engine process write them to stderr
(the pod's log) and carry on. This is how a hung rank is diagnosed: the operator, or a person with
``kubectl exec``, signals each worker and reads where each one waits (usually a collective whose peer is gone).

``faulthandler`` writes from its C signal handler, so the dump works even while the main thread is blocked in a
collective or holds the GIL in C code, where a Python-level handler would never run. The operator asks for a dump
through a pod annotation (``watch_dump_requests``), so it needs no pods/exec.
"""
from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback

STACK_DUMP_SIGNAL = signal.SIGUSR1


def install_stack_dump() -> None:
    """To the process's stderr descriptor: a stand-in ``sys.stderr`` (a caller capturing output) may have none."""
    try:
        sys.stderr.fileno()
        out = sys.stderr
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        out = sys.__stderr__
    faulthandler.register(STACK_DUMP_SIGNAL, file=out, all_threads=True, chain=False)


# The operator asks for stacks without pods/exec: it sets this annotation on the job's pods (a new value per
# request), the kubelet refreshes the pod's downwardAPI file of annotations, and every engine process watching that
# file dumps its stacks (the same dump as SIGUSR1). The operator imports these names, so the two never drift.
STACK_DUMP_ANNOTATION = "ascendtrain.dev/stack-dump-request"
ANNOTATIONS_FILE_ENV = "ASCEND_POD_ANNOTATIONS"
WATCH_SECONDS = 1.0


def read_annotation(path: str, key: str) -> str | None:
    """One annotation from a downwardAPI file: the kubelet writes one ``key="value"`` line per annotation, the
    value quoted as Go's %q does (a JSON string for what the operator writes)."""
    try:
        text = open(path, encoding="utf-8").read()
    except OSError:
        return None
    for line in text.splitlines():
        name, sep, quoted = line.partition("=")
        if sep and name == key:
            try:
                return str(json.loads(quoted))
            except ValueError:
                return quoted.strip('"')
    return None


def watch_dump_requests() -> None:
    """When the pod has the annotations file (``ASCEND_POD_ANNOTATIONS``), a daemon thread dumps this process's
    stacks each time the request annotation takes a new value. A thread can do this while the main thread waits
    in a collective (the wait releases the GIL); a stopped process (SIGSTOP) dumps nothing, but its peers' stacks
    show the collective they wait in for it."""
    path = os.environ.get(ANNOTATIONS_FILE_ENV)
    if not path:
        return
    seen = read_annotation(path, STACK_DUMP_ANNOTATION)  # a request older than this process is not for it

    def watch() -> None:
        nonlocal seen
        while True:
            time.sleep(WATCH_SECONDS)
            request = read_annotation(path, STACK_DUMP_ANNOTATION)
            if request and request != seen:
                seen = request
                dump_stacks(request)

    threading.Thread(target=watch, name="stack-dump-watch", daemon=True).start()


def dump_stacks(request: str) -> None:
    """Every thread's stack to stderr (the pod's log) by faulthandler, and from global rank 0 an event with where
    its main thread is, which the operator posts on the job."""
    rank = os.environ.get("RANK", "0")
    print(f"stack dump requested ({request}): rank {rank}, pid {os.getpid()}, every thread, most recent call "
          "first", file=sys.stderr, flush=True)
    os.kill(os.getpid(), STACK_DUMP_SIGNAL)
    if rank == "0":
        from .telemetry import emit_event

        emit_event("Warning", "StackDump", f"rank 0 (pid {os.getpid()}) main thread, innermost first: "
                   f"{main_thread_summary()}; every rank's full stacks are in its pod's log")


def main_thread_summary(frames: int = 6) -> str:
    """The innermost frames of the main thread as ``file:line function`` (an event's message is short)."""
    frame = sys._current_frames().get(threading.main_thread().ident)  # noqa: SLF001 - the documented way
    if frame is None:
        return "no main thread"
    stack = traceback.extract_stack(frame)[-frames:]
    return " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in reversed(stack))
