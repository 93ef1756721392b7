"""AscendTrainJob: N indexed pods x M devices running ``torchrun -m ascend_engine train``."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from ascend_engine.config.train import TrainConfig

from .devices import DeviceSettings, HcclSettings
from .kube import JobStatusBase, KubeModel, PodSettings

WORLD_SIZE_RULE = {
    # The same check as TrainConfig.check_world_size, for the API server (CEL) so `kubectl apply` fails early.
    "rule": "(self.nnodes * self.nprocPerNode) % (self.train.parallel.tensorModelParallelSize"
            " * self.train.parallel.pipelineModelParallelSize) == 0",
    "message": "nnodes x nprocPerNode must be divisible by "
               "train.parallel.tensorModelParallelSize x train.parallel.pipelineModelParallelSize",
    "fieldPath": ".nnodes",
    "reason": "FieldValueInvalid",
}


class AscendTrainJobSpec(PodSettings):
    """A distributed training job: the pods (Kubernetes part) and the engine's TrainConfig (`train`)."""

    model_config = PodSettings.model_config | {"json_schema_extra": {"x-kubernetes-validations": [WORLD_SIZE_RULE]}}

    nnodes: Annotated[int, Field(ge=1, le=4096)] = 1
    """Number of pods (torchrun nodes); pod i is NODE_RANK i."""
    nprocPerNode: Annotated[int, Field(ge=1, le=64)] = 1
    """Processes per pod; each gets one device of `devices.resource`."""
    devices: DeviceSettings = DeviceSettings()
    """Accelerator requested per pod."""
    hccl: HcclSettings = HcclSettings()
    """HCCL settings for Ascend pods."""
    masterPort: Annotated[int, Field(ge=1024, le=65535)] = 29500
    """MASTER_PORT of the torchrun rendezvous on pod 0."""
    train: TrainConfig
    """The engine's training configuration (Megatron / MindSpeed-LLM names)."""

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nprocPerNode

    @model_validator(mode="after")
    def _world_size(self) -> "AscendTrainJobSpec":
        try:
            self.train.check_world_size(self.world_size)
        except ValueError as e:
            raise ValueError(f"nnodes x nprocPerNode ({self.nnodes} x {self.nprocPerNode}): {e}") from None
        return self


class TrainProgress(KubeModel):
    """Live figures from rank 0's metrics endpoint."""

    iteration: int | None = None
    """Optimizer steps done."""
    trainIters: int | None = None
    """Steps to run."""
    percent: float | None = None
    """iteration / trainIters x 100."""
    loss: float | None = None
    """Latest LM loss."""
    learningRate: float | None = None
    """Current learning rate."""
    tokensPerSecond: float | None = None
    """Throughput over all ranks."""
    mfu: float | None = None
    """Model FLOPs utilisation (0-1)."""
    etaSeconds: float | None = None
    """Estimated seconds to finish."""
    lastCheckpointIteration: int | None = None
    """Iteration of the newest saved checkpoint."""
    lastUpdateTime: str | None = None
    """When these figures were read (RFC 3339)."""


class AscendTrainJobStatus(JobStatusBase):
    """Observed state of an AscendTrainJob."""

    progress: TrainProgress | None = None
    """Training progress from rank 0."""
