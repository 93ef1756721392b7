"""Hang detection: a running job whose iteration stops advancing is Stalled (pure functions, unit-tested).

The operator reads rank 0's iteration every sweep (``status.progress``). A ``StallClock`` per job and gang
(its attempt, ``attempts.current``) remembers when the iteration last advanced and how long the advances took; the
timeout is ``runPolicy.stallDetection``'s: a floor of its own while starting (until the iteration has advanced
twice: rendezvous, model build, checkpoint load, the first logged steps) and while rank 0 saves a checkpoint,
otherwise the larger of ``minSeconds`` and ``stepTimeFactor`` x the median time between advances (an advance is
what the operator sees: a log interval's worth of steps, or a sweep's when steps are faster than sweeps).

The clock lives in the operator's memory: after an operator restart it starts again at the start-up floor, so a
hang is then caught at most one start-up floor later.
"""
from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from ..api.run_policy import StallDetection

INTERVALS_KEPT = 31  # the median of the last this many times between advances


@dataclass
class StallClock:
    generation: int  # the gang (its attempt: restarts + resizes) this clock belongs to
    since: float  # monotonic seconds: when the iteration last advanced, or when the gang was first seen running
    iteration: int | None = None
    advances: int = 0
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=INTERVALS_KEPT))
    saving: bool = False
    finished: bool = False
    dump_requested_at: float | None = None  # stacks asked for; the restart follows stackDumpSeconds later

    def observe(self, iteration: int | None, saving: bool, at: float, total: int | None = None) -> bool:
        """Take one reading of rank 0 (``iteration`` None: it has not reported one yet, or did not answer: a
        stopped rank 0 answers nothing); True when it advanced. ``total``: the run's trainIters."""
        self.saving = saving
        if iteration is not None and total is not None and iteration >= total:
            self.finished = True  # what follows (the final save, an evaluation) has no iteration to watch
        if iteration is None or iteration == self.iteration:
            return False
        if self.advances:
            self.intervals.append(at - self.since)
        self.iteration, self.since = iteration, at
        self.advances += 1
        self.dump_requested_at = None
        return True


def timeout(policy: StallDetection, clock: StallClock) -> tuple[float, str]:
    """(seconds the iteration may stay where it is, why that long)."""
    if clock.saving:
        return float(policy.checkpointSeconds), "stallDetection.checkpointSeconds: rank 0 is saving a checkpoint"
    if clock.advances < 2:
        return float(policy.startupSeconds), "stallDetection.startupSeconds: starting (rendezvous, loading, first steps)"
    if policy.timeoutSeconds is not None:
        return float(policy.timeoutSeconds), "stallDetection.timeoutSeconds"
    median = statistics.median(clock.intervals)
    derived = policy.stepTimeFactor * median
    if derived <= policy.minSeconds:
        return float(policy.minSeconds), f"stallDetection.minSeconds (the iteration advances every {median:.1f}s)"
    return derived, f"{policy.stepTimeFactor:g} x the median {median:.1f}s between advances of the iteration"


def stalled(policy: StallDetection, clock: StallClock, at: float) -> str | None:
    """Why the job is stalled at ``at``, or None while it is within its timeout."""
    if clock.finished:
        return None
    limit, why = timeout(policy, clock)
    waited = at - clock.since
    if waited <= limit:
        return None
    where = f"iteration {clock.iteration}" if clock.iteration is not None else "no iteration reported yet"
    return f"{where}: no progress for {waited:.0f}s (timeout {limit:.0f}s, {why})"
