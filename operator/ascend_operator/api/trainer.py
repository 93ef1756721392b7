"""Bring your own trainer: the job's pods run a user's command (Megatron-LM's or MindSpeed-LLM's ``torchrun ...
pretrain_gpt.py`` line, or any torchrun program) in the user's image instead of the engine, with everything else
the operator gives the engine: indexed pods, torchrun's and HCCL's environment, devices, gang scheduling, gang
restart, SIGTERM grace, suspension, Kueue and the Failed cause.

torchrun reads its rendezvous from the PET_* variables the operator sets, so a plain ``torchrun pretrain_gpt.py
...`` joins the gang without ``--nnodes`` / ``--node-rank`` / ``--master-addr``; ``$(NNODES)``-style references in
command and args are expanded by the kubelet as in any Pod."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .kube import NO_NUL_PATTERN, KubeModel

ExecString = Annotated[str, Field(pattern=NO_NUL_PATTERN)]

DEFAULT_METRICS_PORT = 9400


class TrainerCommand(KubeModel):
    """The user's own trainer: command and arguments run in every pod (spec.image, spec.env, spec.volumes)."""

    command: Annotated[list[ExecString], Field(min_length=1)]
    """The program, e.g. [torchrun, pretrain_gpt.py] or [bash, -c, "torchrun ..."]."""
    args: list[ExecString] = []
    """Its arguments, after command."""
    workingDir: ExecString | None = None
    """Working directory of the container (the image's by default)."""
    progress: Literal["megatron", "none"] = "megatron"
    """megatron: the command runs under `ascend-engine watch` (the image needs the ascend-train-operator Python
    package), which reads Megatron-LM / MindSpeed-LLM iteration lines from its output and serves them as the
    engine's metrics, so status.progress, the columns, the dashboard and Prometheus work without changing the
    training code; workers wait for pod 0 with `ascend-engine wait-for-master`. none: the command runs as given
    (an image without the package); it may serve the metrics contract itself (docs/byo-trainer.md)."""
    metricsPort: Annotated[int, Field(ge=1024, le=65535)] = DEFAULT_METRICS_PORT
    """Port of the metrics endpoint (ASCEND_METRICS_PORT in the pods); the operator reads pod 0 and the last pod
    (Megatron prints its iteration lines on the last rank)."""
