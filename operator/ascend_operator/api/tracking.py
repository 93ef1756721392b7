"""``status.tracking`` of an AscendTrainJob: where the experiment trackers keep the run (train.observability.trackers).

Rank 0 serves it at ``/tracking`` beside its metrics and in its final report; the ids are the same across restarts
(the engine keeps them beside the checkpoints), so this says where the whole job's curves are.
"""
from __future__ import annotations

from .kube import KubeModel


class TrackedRun(KubeModel):
    """One tracker's run of this job."""

    tracker: str
    """mlflow, wandb or swanlab."""
    runId: str
    """The tracker's run id (the same after a restart or resume)."""
    url: str | None = None
    """The run's page in the tracker (an online run)."""
    location: str | None = None
    """Where an offline run waits to be synced (wandb, swanlab), or MLflow's local store."""
