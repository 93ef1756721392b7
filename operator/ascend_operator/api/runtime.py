"""AscendTrainingRuntime (namespaced, short name atr) and ClusterAscendTrainingRuntime (cluster-wide, catr): the
pod-level part of a job that a platform team sets once (image, devices, HCCL, env, volumes, scheduling,
security), as Kubeflow Trainer v2's TrainingRuntime / ClusterTrainingRuntime. A job names one in
``spec.runtimeRef`` and sets only what differs; the operator merges them (``ascend_operator.kinds.runtimes``).

The template's fields are the job's own (same names, types, bounds and descriptions, generated from
``AscendTrainJobSpec``), all optional and without defaults: the job's own defaults apply after the merge.
"""
from __future__ import annotations

from typing import Annotated, Any, Optional

from pydantic import Field, create_model, field_validator
from pydantic.fields import FieldInfo

from .admission import RESERVED_ENV_MESSAGE, reserved_env
from .kube import EnvVar, KubeModel, POD_LIST_MAX, PodSettings
from .train_job import AscendTrainJobSpec

# The job fields a runtime may set: every pod-level one, plus the devices, HCCL and gang scheduling of a train job.
RUNTIME_FIELDS: tuple[str, ...] = (*(f for f in PodSettings.model_fields if f != "runtimeRef"),
                                   "devices", "hccl", "gangScheduling", "volcanoQueue")
# A DatasetPrep or CheckpointConvert takes a runtime's pod settings but not its devices, HCCL or gang scheduling:
# it runs one pod, on CPU unless it asks for a device itself.
SINGLE_POD_FIELDS = tuple(f for f in RUNTIME_FIELDS if f not in ("devices", "hccl", "gangScheduling", "volcanoQueue"))


def _optional(info: FieldInfo) -> tuple[Any, FieldInfo]:
    field = FieldInfo.merge_field_infos(info, default=None)
    field.default_factory = None
    return Optional[info.annotation], field


class _TemplateBase(KubeModel):
    @field_validator("env", check_fields=False)
    @classmethod
    def _not_reserved(cls, env: list[EnvVar] | None) -> list[EnvVar] | None:
        name = reserved_env([e.name for e in env or []])
        if name:
            raise ValueError(f"env {name} {RESERVED_ENV_MESSAGE}")
        return env


RuntimeTemplate = create_model(
    "RuntimeTemplate", __base__=_TemplateBase, __doc__=(
        "The pod settings jobs that name this runtime start from: the same fields as an AscendTrainJob's spec, "
        "none required, none defaulted (the job's defaults apply to what neither sets)."),
    **{name: _optional(AscendTrainJobSpec.model_fields[name]) for name in RUNTIME_FIELDS})


class TrainingRuntimeSpec(KubeModel):
    """A training runtime: the pod settings it gives the jobs that name it, and which of them they may not change."""

    template: RuntimeTemplate = RuntimeTemplate()  # type: ignore[valid-type]
    """Pod settings (image, devices, hccl, env, volumes, nodeSelector, tolerations, affinity, priorityClassName,
    schedulerName, gangScheduling, securityContext, terminationGracePeriodSeconds, ...), as in a job's spec."""
    lockedFields: Annotated[list[Annotated[str, Field(max_length=128)]], Field(max_length=POD_LIST_MAX)] = []
    """Template fields a job may not set to anything else, e.g. [image, securityContext, devices.resource]: the
    operator fails such a job before creating pods, naming the runtime and the field (docs/runtimes.md)."""

    @field_validator("lockedFields")
    @classmethod
    def _known(cls, locked: list[str]) -> list[str]:
        for path in locked:
            if path.split(".", 1)[0] not in RUNTIME_FIELDS:
                raise ValueError(f"lockedFields: {path!r} is not a runtime field (one of {', '.join(RUNTIME_FIELDS)})")
        return locked


class TrainingRuntimeStatus(KubeModel):
    """Runtimes have no status of their own; jobs record the runtime they used in status.runtime."""
