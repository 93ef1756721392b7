"""Assemble an AscendTrainJob from an evaluated launch script, and say what was left behind."""
from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from ..config.loader import ConfigError, format_validation_error
from ..config.train import TrainConfig
from .fidelity import gaps
from .inference import import_inference  # evaluation.py / inference.py launches
from .launch import find_launch
from .parts import DEFAULT_IMAGE, ImportedJob, hccl_and_env, job_name, launch_shape, paths_named, pod_shape
from .shell import ScriptError, read_script
from .tools import import_tool, tool_of
from .train_flags import map_flags

def import_script(text: str, source: str, *, image: str = DEFAULT_IMAGE, name: str | None = None,
                  namespace: str | None = None, preset: dict[str, str] | None = None) -> ImportedJob:
    """The AscendTrainJob equivalent to the launch script ``text`` (read from ``source``)."""
    from ascend_operator.api.group import TRAIN_JOB  # the kind's names have one home, next to the CRD
    from ascend_operator.api.train_job import AscendTrainJobSpec

    try:
        script = read_script(text, preset)
    except ScriptError as e:
        raise ConfigError(f"{source}: {e}") from None
    base = name or job_name(source)
    tool_commands = [c for c in script.commands if tool_of(c)]
    tools, tool_skipped = [], []
    for index, command in enumerate(tool_commands):
        kind = tool_of(command)[0]
        suffix = ("prep" if kind == "DatasetPrep" else "convert") + (f"-{index}" if len(tool_commands) > 1 else "")
        resource, skipped = import_tool(command, source, f"{base[:50]}-{suffix}", image)
        if namespace:
            resource["metadata"]["namespace"] = namespace
        tools.append(resource)
        tool_skipped += [f"{source}:{command.line}: {s}" for s in skipped]
    try:
        launch, other_launches = find_launch(script, skip=lambda c: tool_of(c) is not None)
        nproc, nnodes, notes = launch_shape(launch.launcher, launch.line)

        if inferred := import_inference(script, launch, source, image=image, name=base, namespace=namespace):
            return inferred
    except ScriptError as e:
        if tools and "no training launch found" in str(e):  # a conversion or preprocessing script
            notes = [f"{source}: {w}" for w in script.warnings] + tool_skipped
            return ImportedJob({}, notes=notes, tools=tools,
                               gaps=[f"variables used but not set in the script: {', '.join('$' + v for v in script.unset)}"
                                     " (give them with --set VAR=VALUE)"] if script.unset else [])
        raise ConfigError(f"{source}: {e}") from None
    notes += tool_skipped
    notes += [f"{source}:{c.line}: another launch ({' '.join(c.words[:3])} ...) not imported"
              for c in other_launches]
    if launch.stray:
        notes.append(f"words before the first flag not imported: {' '.join(launch.stray)}")
    notes += [f"{source}: {w}" for w in script.warnings]
    mapped = map_flags(launch.flags)
    hccl, env, env_notes = hccl_and_env(script)
    notes += env_notes

    try:
        train = TrainConfig.model_validate(mapped.data)
    except ValidationError as e:
        raise ConfigError(f"{source}: the script's training flags do not make a valid config:\n"
                          + format_validation_error(e, f"{source}:{launch.line}", prefix=("train",))) from None
    spec = pod_shape(image, nnodes, nproc, launch.launcher, hccl, env)
    spec["train"] = train.model_dump(mode="json", by_alias=True, exclude_unset=True)
    lost = gaps(spec["train"], launch.launcher, list(script.unset))
    try:
        AscendTrainJobSpec.model_validate(spec)
    except ValidationError as e:
        because = "".join(f"\n  likely because: {g}" for g in lost)  # an unresolved variable, not the script
        raise ConfigError(format_validation_error(e, f"{source}:{launch.line}", prefix=("spec",)) + because) from None
    metadata: dict[str, Any] = {"name": base}
    if namespace:
        metadata["namespace"] = namespace
    manifest = {"apiVersion": TRAIN_JOB.api_version, "kind": TRAIN_JOB.kind, "metadata": metadata, "spec": spec}
    return ImportedJob(manifest, mapped.skipped, notes, paths_named(spec["train"], mapped.skipped), lost, tools,
                       mapped.no_effect)
