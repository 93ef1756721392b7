"""``status.evaluation`` of an AscendTrainJob: what ``ascend-engine evaluate`` left in its termination message."""
from __future__ import annotations

from .kube import KubeModel


class TaskAccuracy(KubeModel):
    """One benchmark's result."""

    task: str
    """Benchmark name (mmlu, gsm8k, ...)."""
    accuracy: float
    """Correct / samples (0-1)."""
    samples: int
    """Questions evaluated."""
    seconds: float | None = None
    """Wall time of the task."""


class EvaluationStatus(KubeModel):
    """Benchmark results of the job's `evaluation` block, from rank 0 after it finished."""

    summary: str | None = None
    """One line, task=accuracy for each task (the Eval printer column)."""
    tasks: list[TaskAccuracy] = []
    """Per-task accuracy and sample count."""
    checkpoint: str | None = None
    """The checkpoint that was evaluated."""
    finishedAt: str | None = None
    """When the evaluation finished (RFC 3339)."""
