"""``status.recoveries`` and ``status.goodput``: what each recovery was and cost, and what the job has trained.

Measured, not estimated: the engine's rank 0 marks its process's start-up (``ascend_engine.train.goodput``), the
pods' torchrun agents record an in-place restart (``ascend_engine.inplace``), and the operator records when it
decided a gang restart and when the old pods were gone (``ascend_operator.recovery.goodput``).
"""
from __future__ import annotations

from typing import Literal

from .kube import KubeModel

MAX_RECOVERIES = 20  # the newest kept in status; the events keep every one

RecoveryLevel = Literal["InProcess", "InPlace", "Replace", "Resize"]


class RecoveryParts(KubeModel):
    """Seconds of one recovery, in order; they add up to ``totalSeconds`` once the run has caught up."""

    detection: float | None = None
    """From the failure (the worker's or pod's end) to the decision to recover (torchrun's agent, or the operator)."""
    stopping: float | None = None
    """Stopping the old workers (in place) or until every old pod was gone (replace, resize)."""
    podStart: float | None = None
    """Scheduling, image pull and container start of the new pods (replace, resize), starting the new worker
    processes (in place), to the engine process's start; in process, until the last rank (a warm spare for a dead
    one) began joining the new process group."""
    rendezvous: float | None = None
    """Importing torch and Megatron-core and joining the process group (in process: joining only)."""
    checkpointLoad: float | None = None
    """Building the model and loading the last checkpoint (in process: from host memory), to the first step."""
    retrain: float | None = None
    """Training again the steps between the checkpoint and the highest iteration reached before the failure."""


class Recovery(KubeModel):
    """One recovery: the level of the ladder that handled it and its cost."""

    level: RecoveryLevel
    """InProcess (the ranks restarted the training function in their processes, a warm spare for a dead one),
    InPlace (torchrun restarted the workers; pods kept), Replace (gang restart) or Resize (elastic scale)."""
    reason: str
    """Why: the failure's reason."""
    message: str = ""
    """What failed."""
    time: str
    """When the recovery began (RFC 3339)."""
    highWaterIteration: int | None = None
    """The highest iteration reached before the failure: the engine's own record of it (written at each logged
    step beside the checkpoints) once the next process reports it, else the operator's last reading."""
    fromIteration: int | None = None
    """The checkpoint iteration training resumed from."""
    lostIterations: int | None = None
    """Steps trained again: from fromIteration to the highest iteration reached before the failure."""
    seconds: RecoveryParts = RecoveryParts()
    """Its parts."""
    totalSeconds: float | None = None
    """From the failure until training was past its earlier high-water mark again, or, when the next failure
    came first, until that failure (the part it was in gets the rest, so the parts still add up)."""


class Goodput(KubeModel):
    """Productive training time against wall time since the first pod started: the parts add up to wallSeconds."""

    goodput: float | None = None
    """productiveSeconds / wallSeconds (0-1)."""
    wallSeconds: float | None = None
    """Since status.startTime (to completionTime once finished)."""
    productiveSeconds: float | None = None
    """Training loop time spent on iterations past the run's high-water mark (measured by rank 0)."""
    recoverySeconds: float | None = None
    """Sum of the recoveries' totalSeconds."""
    otherSeconds: float | None = None
    """The rest: the first start-up, waiting while suspended or queued, the final save and exit."""
    highWaterIteration: int | None = None
    """The highest iteration the job has reached."""
    inPlaceRestarts: int | None = None
    """In-place restarts the current pods' torchrun agents have made (rank 0 reports them)."""
    inProcessRestarts: int | None = None
    """In-process restarts of the current attempt (rank 0 reports them)."""
    engineStartTime: str | None = None
    """When rank 0's engine process began (RFC 3339): a new one means a restart."""
    productiveBeforeSeconds: float | None = None
    """Productive seconds of earlier engine processes that could not carry them over (no checkpoint.save: the
    engine keeps its count in a file beside the checkpoints)."""
