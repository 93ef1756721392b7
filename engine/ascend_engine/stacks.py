"""Every thread's Python stack on demand: ``kill -USR1 <pid>`` makes an engine process write them to stderr
(the pod's log) and carry on. This is how a hung rank is diagnosed: the operator, or a person with
``kubectl exec``, signals each worker and reads where each one waits (usually a collective whose peer is gone).

``faulthandler`` writes from its C signal handler, so the dump works even while the main thread is blocked in a
collective or holds the GIL in C code, where a Python-level handler would never run.
"""
from __future__ import annotations

import faulthandler
import signal
import sys

STACK_DUMP_SIGNAL = signal.SIGUSR1


def install_stack_dump() -> None:
    """To the process's stderr descriptor: a stand-in ``sys.stderr`` (a caller capturing output) may have none."""
    try:
        sys.stderr.fileno()
        out = sys.stderr
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        out = sys.__stderr__
    faulthandler.register(STACK_DUMP_SIGNAL, file=out, all_threads=True, chain=False)
