"""What the lifecycle needs to know of a kind, declared once per kind (``kinds/train_job.py``,
``kinds/single_pod.py``) and registered here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel

from ..api.group import TRAIN_JOB, Kind
from ..api.run_policy import StallDetection
from ..cache.job_pods import JobPods


@dataclass(frozen=True)
class JobKind:
    kind: Kind
    spec_model: type[BaseModel]
    replicas: Callable[[Any], int]
    render: Callable[[str, str, Any], list[dict[str, Any]]]  # (name, namespace, spec) -> objects
    metrics_port: Callable[[Any], int | None]
    progress_fields: dict[str, str]  # metric field (ascend_engine.telemetry) -> status.progress field
    result_field: str  # where rank 0's final report goes: "progress" (merged) or "outputs"
    # (job object, resolved spec, status) -> (spec to render, status fields to add): e.g. host ports.
    prepare: Callable[[dict[str, Any], Any, dict[str, Any]], tuple[Any, dict[str, Any]]] = \
        lambda obj, spec, status: (spec, {})
    # The engine's final report -> status.progress fields once Succeeded (a short job may end between scrapes).
    final_progress: Callable[[dict[str, Any]], dict[str, Any]] = lambda result: {}
    # status.progress -> the same with its printer-column strings (TrainProgress.with_columns).
    progress_columns: Callable[[dict[str, Any]], dict[str, Any]] = lambda progress: progress
    # Indices of the pods whose metrics endpoint and final report make the progress (later ones win): rank 0 for
    # the engine; a Megatron-style trainer prints its iteration lines on the last rank.
    reporting_pods: Callable[[Any], list[int]] = lambda spec: [0]
    # (job object, spec before prepare, derived status, pods) -> (status, reason, message) to restart at another
    # size (reason ScaledIn / ScaledOut), (status, "", "") for a status-only change, or None: elastic jobs.
    resize: Callable[[dict[str, Any], Any, dict[str, Any], JobPods], tuple[dict[str, Any], str, str] | None] = \
        lambda obj, spec, status, pods: None
    # The spec's hang detection, or None where the kind has none (runPolicy.stallDetection, engine jobs only).
    stall_detection: Callable[[Any], StallDetection | None] = lambda spec: None
    # NODE_RANK ordered by placement (spec.topology of an engine job): (levels, tensor-parallel level, pods per
    # tensor-parallel group), or None where pod i is NODE_RANK i (``topology.placement``).
    rank_order: Callable[[Any], tuple[list[str], str | None, int] | None] = lambda spec: None

    @property
    def trains(self) -> bool:
        """Training jobs keep status.recoveries and status.goodput (the single-pod kinds have no training loop)."""
        return self.kind.kind == TRAIN_JOB.kind


KINDS: dict[str, JobKind] = {}


def register(job: JobKind) -> None:
    """Follow ``job``'s kind: its informer starts with the workers (``workers.start``)."""
    KINDS[job.kind.kind] = job
