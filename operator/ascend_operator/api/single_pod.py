"""DatasetPrep and CheckpointConvert: one pod running one engine command, CPU unless told otherwise."""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from ascend_engine.config.convert import ConvertConfig
from ascend_engine.config.prep import PrepConfig

from .devices import CpuDeviceSettings
from .kube import IMAGE_RULE, JobStatusBase, KubeModel, ObjectName, PodSettings
from .run_policy import RunPolicy


class SinglePodSettings(PodSettings):
    """Pod settings of a one-pod engine job; no accelerator is requested by default."""

    devices: CpuDeviceSettings = CpuDeviceSettings()
    """Accelerator for the pod (none by default: conversion and preprocessing run on CPU)."""
    metricsPort: int = Field(9400, ge=1, le=65535)
    """Port of the pod's Prometheus endpoint the operator reads progress from."""
    runPolicy: RunPolicy = RunPolicy()
    """Restarts, deadline, clean-up, TTL and suspension."""


class DatasetPrepSpec(SinglePodSettings):
    """Raw data -> Megatron indexed dataset with MindSpeed-LLM's file names."""

    prep: PrepConfig
    """The engine's preprocessing configuration (MindSpeed-LLM preprocess_data.py names)."""


TRAIN_JOB_RULES = [
    {"rule": "has(self.trainJobRef) != has(self.convert.loadDir)",
     "message": "set exactly one of convert.loadDir and trainJobRef (whose checkpoint.save becomes loadDir)",
     "fieldPath": ".trainJobRef", "reason": "FieldValueRequired"},
    {"rule": "!has(self.trainJobRef) || self.convert.loadModelType == 'mg'",
     "message": "trainJobRef exports a Megatron checkpoint: convert.loadModelType must be mg",
     "fieldPath": ".convert.loadModelType", "reason": "FieldValueInvalid"},
]


class ConvertSettings(ConvertConfig):
    """The engine's ConvertConfig, except that loadDir may come from the AscendTrainJob named in trainJobRef."""

    loadDir: Annotated[str | None, Field(min_length=1)] = None  # type: ignore[assignment]
    """Checkpoint to read; leave it unset with trainJobRef (that job's checkpoint.save is used)."""

    def engine_config(self) -> ConvertConfig:
        """The config the pod's engine reads (loadDir filled in by then), validated by the engine's own model."""
        return ConvertConfig.model_validate(self.model_dump(by_alias=True, exclude_none=True))


class CheckpointConvertSpec(SinglePodSettings):
    """HuggingFace <-> Megatron-core conversion, resharding or LoRA merge."""

    model_config = SinglePodSettings.model_config | {
        "json_schema_extra": {"x-kubernetes-validations": [*TRAIN_JOB_RULES, IMAGE_RULE]}}

    convert: ConvertSettings
    """The engine's conversion configuration (MindSpeed-LLM convert_ckpt.py names)."""
    trainJobRef: ObjectName | None = None
    """Name of an AscendTrainJob in the same namespace: wait until it has succeeded, then convert its last
    checkpoint (its checkpoint.save), e.g. to HuggingFace with saveModelType hf. For a LoRA job, merge its
    adapters into the base it trained on (its checkpoint.load), with its LoRA rank, alpha and targets."""

    @model_validator(mode="after")
    def _load_source(self) -> "CheckpointConvertSpec":
        broken = ((self.trainJobRef is None) == (self.convert.loadDir is None),
                  bool(self.trainJobRef and self.convert.loadModelType != "mg"))
        for rule, bad in zip(TRAIN_JOB_RULES, broken):
            if bad:
                raise ValueError(rule["message"])
        return self


class WorkProgress(KubeModel):
    """Progress of a one-pod job."""

    done: int | None = None
    """Units done (records or layers)."""
    total: int | None = None
    """Units to do, when known."""
    percent: float | None = None
    """done / total x 100."""
    etaSeconds: float | None = None
    """Estimated seconds to finish."""
    lastUpdateTime: str | None = None
    """When these figures were read."""


class SinglePodStatus(JobStatusBase):
    """Observed state of a one-pod engine job."""

    progress: WorkProgress | None = None
    """Progress from the pod's metrics."""
    outputs: dict[str, Any] | None = None
    """What the engine wrote (its final report): paths, file names and counts; an AscendTrainJob can use them."""
