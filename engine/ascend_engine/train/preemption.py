"""Preemption: on SIGTERM (node drain, Kueue preemption, spot loss) finish the step in flight, save a checkpoint
and exit with a code the operator's run policy retries, so the job resumes from that step.

The kubelet sends SIGTERM to the container (torchrun), torchrun forwards it to every worker and waits
``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` seconds before SIGKILL; the operator sets that just under the pod's
``terminationGracePeriodSeconds``. Ranks may receive the signal between different collectives, so after each
step all ranks agree (one tiny all-reduce) and stop after the same step.

A Python signal handler only runs when the main thread is back in the interpreter; a rank blocked in a collective
whose peer is gone (the usual state of the survivors when another pod died) would never get there, and the
SIGTERM that used to kill it at once would wait out the grace period. So the signal is also seen by a watchdog
thread (``signal.set_wakeup_fd``): when the loop has not reached a step boundary within a few step times, the
rank exits with the same code without saving (its last step is not complete anyway).
"""
from __future__ import annotations

import os
import signal
import socket
import threading
import time
from typing import Any

# 128 + SIGTERM: a signal death, which the run policy counts as retryable.
PREEMPTED_EXIT_CODE = 143
# Reaching the next step boundary after SIGTERM may take this many times the longest step so far (at least
# MIN_BOUNDARY_S): longer means the rank is stuck in a collective.
BOUNDARY_STEPS, MIN_BOUNDARY_S = 3.0, 10.0


class PreemptionWatch:
    """Records SIGTERM in this process; ``agreed`` says when any rank has received it."""

    def __init__(self) -> None:
        self.received_at: float | None = None
        self.longest_step_s = 0.0
        self._acknowledged = threading.Event()
        self._previous: Any = None
        self._previous_fd: int | None = None
        self._pipe: tuple[socket.socket, socket.socket] | None = None

    def install(self) -> "PreemptionWatch":
        if threading.current_thread() is not threading.main_thread():
            return self
        self._previous = signal.signal(signal.SIGTERM, lambda signum, frame: self._received())
        self._pipe = socket.socketpair()
        self._pipe[1].setblocking(False)
        self._previous_fd = signal.set_wakeup_fd(self._pipe[1].fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._watch, name="preemption-watchdog", daemon=True).start()
        return self

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            signal.set_wakeup_fd(self._previous_fd if self._previous_fd is not None else -1)
            self._previous = None
        self._acknowledged.set()  # the watchdog has nothing left to guard

    def _received(self) -> None:
        if self.received_at is None:
            self.received_at = time.monotonic()
            print(f"rank {os.environ.get('RANK', '0')}: SIGTERM received: finishing this step, then saving a "
                  "checkpoint", flush=True)

    def _watch(self) -> None:
        assert self._pipe is not None
        while True:
            data = self._pipe[0].recv(64)  # one byte per signal, written by CPython's C-level handler
            if not data:
                return
            if signal.SIGTERM in data:
                break
        self._received()
        limit = max(MIN_BOUNDARY_S, BOUNDARY_STEPS * self.longest_step_s)
        if not self._acknowledged.wait(limit):
            print(f"rank {os.environ.get('RANK', '0')}: no step boundary {limit:.0f}s after SIGTERM (blocked in a "
                  "collective?): exiting without a checkpoint", flush=True)
            os._exit(PREEMPTED_EXIT_CODE)

    def step_done(self, seconds: float) -> None:
        self.longest_step_s = max(self.longest_step_s, seconds)

    def agreed(self) -> bool:
        """Whether any rank has been told to stop (collective: every rank calls it after every step)."""
        import torch

        from ..device import all_reduce_host

        flag = torch.tensor([1.0 if self.received_at is not None else 0.0], dtype=torch.float64)
        flag = all_reduce_host(flag, torch.distributed.ReduceOp.MAX)
        stop = flag.item() > 0
        if stop:
            if self.received_at is None:
                self.received_at = time.monotonic()  # another rank got it first: measure from when this one learnt
            self._acknowledged.set()  # at a boundary: the save may take as long as the grace period allows
        return stop

    def seconds_since_signal(self) -> float | None:
        return None if self.received_at is None else time.monotonic() - self.received_at
