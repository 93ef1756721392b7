"""Preemption: on SIGTERM (node drain, Kueue preemption, spot loss) finish the step in flight, save a checkpoint
and exit with a code the operator's run policy retries, so the job resumes from that step.

The kubelet sends SIGTERM to the container (torchrun), torchrun forwards it to every worker and waits
``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` seconds before SIGKILL; the operator sets that just under the pod's
``terminationGracePeriodSeconds``. The handler only records the signal: ranks may receive it between different
collectives, so after each step all ranks agree (one tiny all-reduce) and stop after the same step.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import torch

# 128 + SIGTERM: a signal death, which the run policy counts as retryable.
PREEMPTED_EXIT_CODE = 143


class PreemptionWatch:
    """Records SIGTERM in this process; ``agreed`` says when any rank has received it."""

    def __init__(self) -> None:
        self.received_at: float | None = None
        self._previous: Any = None

    def install(self) -> "PreemptionWatch":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self.received_at is None:
            self.received_at = time.monotonic()
            print(f"rank {os.environ.get('RANK', '0')}: SIGTERM received: finishing this step, then saving a "
                  "checkpoint", flush=True)

    def agreed(self) -> bool:
        """Whether any rank has been told to stop (collective: every rank calls it after every step)."""
        flag = torch.tensor([1.0 if self.received_at is not None else 0.0], dtype=torch.float64)
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        if flag.item() > 0 and self.received_at is None:
            self.received_at = time.monotonic()  # another rank got it first: measure from when this one learnt
        return flag.item() > 0

    def seconds_since_signal(self) -> float | None:
        return None if self.received_at is None else time.monotonic() - self.received_at
