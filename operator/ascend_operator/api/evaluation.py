"""``status.evaluation`` of an AscendTrainJob: what ``ascend-engine evaluate`` left in its termination message."""
from __future__ import annotations

from .kube import KubeModel


class TaskAccuracy(KubeModel):
    """One benchmark's result."""

    task: str
    """Benchmark name (mmlu, gsm8k, ...; an lm-eval task or group name)."""
    accuracy: float | None = None
    """Correct / samples (0-1). lm-eval tasks: the value of ``metric`` (none for a task without an accuracy-like
    metric, such as a perplexity)."""
    metric: str | None = None
    """lm-eval tasks: the metric ``accuracy`` holds (``acc,none``: metric and filter), or the first metric."""
    metrics: dict[str, float] | None = None
    """lm-eval tasks: every metric lm-eval reported for the task or group (keys as in its results:
    ``acc,none``, ``acc_norm,none``, ``exact_match,strict-match``, ``word_perplexity,none``), no standard
    errors."""
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
    backend: str | None = None
    """``lm-eval`` where lm-evaluation-harness defined the tasks (unset: our own tasks)."""
    seconds: float | None = None
    """lm-eval runs: wall time of the whole run (lm-eval batches every task's requests together, so its tasks
    have no time of their own)."""
    finishedAt: str | None = None
    """When the evaluation finished (RFC 3339)."""
