"""Numerics-aware recovery: which steps are numeric faults, and which samples a run skips after one.

A step is a fault when its loss (averaged over the data-parallel replicas) or the global gradient norm is NaN or
Inf, or, in the language-model stages, when its loss is over ``lossSpikeFactor`` times the median loss of the
previous ``lossSpikeWindow`` steps and at least ``SPIKE_MIN_INCREASE`` over it. The loop then reloads its latest
checkpoint in-process and records the fault step's global batch as a skipped window: once the replayed steps
reach that batch, the consumed-samples counter jumps past it (``skip_past``), so the iteration that faulted
trains on the next samples instead, and the iteration count and learning-rate schedule stay those of the
original run. The windows, the rollback count and the recent losses go into every later checkpoint
(``state_dict``), so a restart keeps skipping and keeps counting.

Pure Python (no torch): the loop reduces the decision over all ranks, so every rank rolls back together.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

SPIKE_MIN_INCREASE = 1.0  # nats: near-zero losses of a memorised pattern wobble by large factors, harmlessly
SPIKE_MIN_STEPS = 5  # a median of fewer steps than the window counts once there are this many (or the window's)
SPIKE_STAGES = (None, "pretrain", "sft")  # next-token cross entropy: positive, and a spike means something


class NumericFault(RuntimeError):
    """A numeric fault the run cannot recover from (rollbacks used up, or nothing to roll back to)."""

    def __init__(self, message: str, iteration: int, first_sample: int, end_sample: int):
        super().__init__(message)
        self.iteration, self.first_sample, self.end_sample = iteration, first_sample, end_sample

    def report(self) -> dict:
        """The termination message's fields besides status, reason and message."""
        return {"iteration": self.iteration, "samples": [self.first_sample, self.end_sample]}


@dataclass(frozen=True)
class SkippedWindow:
    iteration: int  # the step whose batch it was
    first_sample: int  # the window is samples [first_sample, end_sample) of the run
    end_sample: int
    reason: str

    @property
    def samples(self) -> int:
        return self.end_sample - self.first_sample


def skip_past(consumed: int, windows: list[SkippedWindow]) -> int:
    """The data position a step starts at: ``consumed``, moved past every skipped window that holds it (windows
    may follow one another)."""
    moved = True
    while moved:
        moved = False
        for w in windows:
            if w.first_sample <= consumed < w.end_sample:
                consumed, moved = w.end_sample, True
    return consumed


def fault_reason(loss: float, grad_norm: float | None, recent: list[float], factor: float, window: int) -> str | None:
    """Why a step is a numeric fault, or None. ``recent``: the losses of the steps before it, oldest first;
    ``factor`` 0 turns spike detection off."""
    if not math.isfinite(loss):
        return f"lm loss is {loss}"
    if grad_norm is not None and not math.isfinite(grad_norm):
        return f"grad norm is {grad_norm}"
    if factor and len(recent) >= min(window, SPIKE_MIN_STEPS):
        steps = recent[-window:]
        median = statistics.median(steps)
        if median > 0 and loss > factor * median and loss - median >= SPIKE_MIN_INCREASE:
            return (f"loss spike: lm loss {loss:.4g} is {loss / median:.1f} x the median {median:.4g} of the last "
                    f"{len(steps)} steps (lossSpikeFactor {factor:g})")
    return None


@dataclass
class NumericsState:
    """What a run remembers about its numeric faults (and keeps in its checkpoints)."""

    rollbacks: int = 0
    windows: list[SkippedWindow] = field(default_factory=list)
    losses: list[tuple[int, float]] = field(default_factory=list)  # (iteration, loss) of recent good steps
    keep: int = 20

    def good_step(self, iteration: int, loss: float) -> None:
        self.losses = [*self.losses, (iteration, loss)][-self.keep:]

    def recent(self) -> list[float]:
        return [loss for _, loss in self.losses]

    def rolled_back(self, to_iteration: int, window: SkippedWindow) -> None:
        """After reloading the checkpoint of ``to_iteration``: the losses of the abandoned steps are forgotten."""
        self.rollbacks += 1
        self.windows = [*self.windows, window]
        self.losses = [(i, loss) for i, loss in self.losses if i <= to_iteration]

    @property
    def skipped_samples(self) -> int:
        return sum(w.samples for w in self.windows)

    def figures(self) -> dict[str, int]:
        """status.progress fields (``telemetry.METRIC_NAMES``): the counts and the newest skipped window."""
        newest = self.windows[-1] if self.windows else None
        return {"numericRollbacks": self.rollbacks, "skippedSamples": self.skipped_samples,
                **({"skippedWindowIteration": newest.iteration, "skippedWindowFirstSample": newest.first_sample,
                    "skippedWindowEndSample": newest.end_sample} if newest else {})}

    def state_dict(self) -> dict:
        return {"rollbacks": self.rollbacks, "skipped_windows": [asdict(w) for w in self.windows],
                "recent_losses": [list(p) for p in self.losses]}

    def load_state_dict(self, state: dict) -> None:
        self.rollbacks = int(state.get("rollbacks", 0))
        self.windows = [SkippedWindow(**w) for w in state.get("skipped_windows", [])]
        self.losses = [(int(i), float(loss)) for i, loss in state.get("recent_losses", [])][-self.keep:]
