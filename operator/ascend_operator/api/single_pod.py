"""DatasetPrep and CheckpointConvert: one pod running one engine command, CPU unless told otherwise."""
from __future__ import annotations

from typing import Any

from pydantic import Field

from ascend_engine.config.convert import ConvertConfig
from ascend_engine.config.prep import PrepConfig

from .devices import DeviceSettings
from .kube import JobStatusBase, KubeModel, PodSettings


class SinglePodSettings(PodSettings):
    """Pod settings of a one-pod engine job; no accelerator is requested by default."""

    devices: DeviceSettings = DeviceSettings(resource=None, ringController=None)
    """Accelerator for the pod (none by default: conversion and preprocessing run on CPU)."""
    metricsPort: int = Field(9400, ge=1, le=65535)
    """Port of the pod's Prometheus endpoint the operator reads progress from."""


class DatasetPrepSpec(SinglePodSettings):
    """Raw data -> Megatron indexed dataset with MindSpeed-LLM's file names."""

    prep: PrepConfig
    """The engine's preprocessing configuration (MindSpeed-LLM preprocess_data.py names)."""


class CheckpointConvertSpec(SinglePodSettings):
    """HuggingFace <-> Megatron-core conversion, resharding or LoRA merge."""

    convert: ConvertConfig
    """The engine's conversion configuration (MindSpeed-LLM convert_ckpt.py names)."""


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
