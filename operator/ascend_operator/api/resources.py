"""Each kind's spec and status models with its printer columns: everything the CRD generator needs."""
from __future__ import annotations

from dataclasses import dataclass

from typing import Any

from pydantic import BaseModel

from .admission import SINGLE_POD_NAME_RULES, TRAIN_JOB_NAME_RULES

from .group import CHECKPOINT_CONVERT, CLUSTER_TRAINING_RUNTIME, DATASET_PREP, TRAIN_JOB, TRAINING_RUNTIME, Kind
from .runtime import TrainingRuntimeSpec, TrainingRuntimeStatus
from .single_pod import CheckpointConvertSpec, DatasetPrepSpec, SinglePodStatus
from .train_job import AscendTrainJobSpec, AscendTrainJobStatus


@dataclass(frozen=True)
class Resource:
    kind: Kind
    spec: type[BaseModel]
    status: type[BaseModel]
    columns: tuple[tuple, ...]  # (name, type, jsonPath, description[, priority: 1 shows only with -o wide])
    description: str
    root_rules: tuple[dict[str, Any], ...] = ()  # CEL rules that see metadata.name (admission.py)
    scope: str = "Namespaced"
    job: bool = True  # False for a runtime: an editable spec (no immutability rules), no status subresource, and
    # no schema defaults (a runtime's template gives only what its author wrote; the job's defaults apply after)


_AGE = ("Age", "date", ".metadata.creationTimestamp", "Time since creation")
_PHASE = ("Phase", "string", ".status.phase", "Pending, Running, Restarting, Succeeded, Failed or Suspended")
# `kubectl get -o wide`: why a job failed, the engine's own last error line where it wrote one.
_FAILURE = ("Failure", "string", '.status.conditions[?(@.type=="Failed")].message',
            "Why the job failed (the engine's last error line, from its termination message)", 1)

_RUNTIME_COLUMNS = (("Image", "string", ".spec.template.image", "The image jobs get unless they set one"),
                    ("Devices", "string", ".spec.template.devices.resource", "Extended resource per process"),
                    ("Locked", "string", ".spec.lockedFields", "Fields jobs may not override"), _AGE)

RESOURCES: dict[str, Resource] = {
    TRAIN_JOB.kind: Resource(
        TRAIN_JOB, AscendTrainJobSpec, AscendTrainJobStatus,
        columns=(
            _PHASE,
            ("Iter", "integer", ".status.progress.iteration", "Optimizer steps done"),
            ("Loss", "string", ".status.progress.columns.loss", "Latest LM loss (4 significant digits)"),
            ("Tok/s", "string", ".status.progress.columns.tokensPerSecond", "Tokens per second over all ranks"),
            ("Eval", "string", ".status.evaluation.summary", "Benchmark accuracy per task (spec.evaluation)"),
            ("Restarts", "integer", ".status.restarts", "Gang restarts"),
            ("Runtime", "string", ".spec.runtimeRef.name", "The training runtime the job names (spec.runtimeRef)"),
            ("Nodes", "string", ".status.elastic.nodes", "Current/desired pods of an elastic job", 1),
            _AGE,
            _FAILURE,
        ),
        description="Pretraining or fine-tuning on N pods x M Ascend NPUs (or GPUs) with Megatron-core via torchrun.",
        root_rules=tuple(TRAIN_JOB_NAME_RULES),
    ),
    DATASET_PREP.kind: Resource(
        DATASET_PREP, DatasetPrepSpec, SinglePodStatus,
        columns=(_PHASE, ("Done", "integer", ".status.progress.done", "Records done"),
                 ("Percent", "number", ".status.progress.percent", "Percent done"), _AGE, _FAILURE),
        description="Raw jsonl/json/parquet/csv/txt/arrow -> Megatron indexed dataset (MindSpeed-LLM names).",
        root_rules=tuple(SINGLE_POD_NAME_RULES),
    ),
    CHECKPOINT_CONVERT.kind: Resource(
        CHECKPOINT_CONVERT, CheckpointConvertSpec, SinglePodStatus,
        columns=(_PHASE, ("Done", "integer", ".status.progress.done", "Layers done"),
                 ("Percent", "number", ".status.progress.percent", "Percent done"), _AGE, _FAILURE),
        description="HuggingFace <-> Megatron-core checkpoint conversion with TP/PP resharding and LoRA merge.",
        root_rules=tuple(SINGLE_POD_NAME_RULES),
    ),
    TRAINING_RUNTIME.kind: Resource(
        TRAINING_RUNTIME, TrainingRuntimeSpec, TrainingRuntimeStatus,
        columns=_RUNTIME_COLUMNS,
        description="Pod settings (image, devices, HCCL, env, volumes, scheduling, security) that AscendTrainJobs "
                    "in this namespace name in spec.runtimeRef.",
        job=False,
    ),
    CLUSTER_TRAINING_RUNTIME.kind: Resource(
        CLUSTER_TRAINING_RUNTIME, TrainingRuntimeSpec, TrainingRuntimeStatus,
        columns=_RUNTIME_COLUMNS,
        description="Cluster-wide pod settings (image, devices, HCCL, env, volumes, scheduling, security) that "
                    "AscendTrainJobs in any namespace name in spec.runtimeRef.",
        scope="Cluster", job=False,
    ),
}
