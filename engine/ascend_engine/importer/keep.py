"""``import-script --keep-as-is``: the script's own trainer under the operator, instead of a translation to the
engine. Its ``torchrun ... pretrain_gpt.py <flags>`` line becomes ``spec.trainer`` (command and args, every flag
kept word for word), its exported variables ``spec.env`` (HCCL's go to ``spec.hccl``), its torchrun shape
``nnodes`` x ``nprocPerNode``. The per-pod launcher options (``--node_rank``, ``--master_addr``, ...) are dropped:
torchrun reads them from the PET_* variables the operator sets on each pod.
"""
from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from ..config.loader import ConfigError, format_validation_error
from .launch import find_launch
from .parts import LAUNCHER_PER_POD, ImportedJob, hccl_and_env, job_name, launch_shape, pod_shape
from .shell import ScriptError, read_script
from .tools import tool_of

_SHAPE_OPTIONS = {"nproc-per-node", "nnodes", "master-port"}  # become nprocPerNode, nnodes, masterPort


def import_as_is(text: str, source: str, *, image: str, name: str | None = None, namespace: str | None = None,
                 preset: dict[str, str] | None = None, workdir: str | None = None) -> ImportedJob:
    """An AscendTrainJob whose trainer is the script's own launch, in ``image`` (the user's MindSpeed-LLM one)."""
    from ascend_operator.api.group import TRAIN_JOB
    from ascend_operator.api.train_job import AscendTrainJobSpec

    try:
        script = read_script(text, preset)
        launch, other_launches = find_launch(script, skip=lambda c: tool_of(c) is not None)
        nproc, nnodes, _ = launch_shape(launch.launcher, launch.line)
    except ScriptError as e:
        raise ConfigError(f"{source}: {e}") from None
    notes = [f"{source}:{c.line}: another command ({' '.join(c.words[:3])} ...) not carried over"
             for c in script.commands if c.line != launch.line]
    notes += [f"torchrun --{k} {v}: set per pod by the operator (PET_* variables)"
              for k, v in launch.launcher.items() if k in LAUNCHER_PER_POD]
    notes += [f"{source}: {w}" for w in script.warnings]
    launcher = [f"--{k}={v}" for k, v in launch.launcher.items() if k not in LAUNCHER_PER_POD | _SHAPE_OPTIONS]
    entry = launch.entry_point.split(" ", 1) if launch.entry_point.startswith("-m ") else [launch.entry_point]
    args = [*launch.stray, *(word for flag, values in launch.flags for word in (flag, *values))]
    if not launch.entry_point.startswith("-m ") and not launch.entry_point.startswith("/") and not workdir:
        notes.append(f"{launch.entry_point} is a relative path: the container's working directory must be the "
                     "checkout that has it (--workdir, or the image's WORKDIR)")
    hccl, env, env_notes = hccl_and_env(script)
    trainer: dict[str, Any] = {"command": ["torchrun", *launcher, *entry], "args": args}
    if workdir:
        trainer["workingDir"] = workdir
    spec = pod_shape(image, nnodes, nproc, launch.launcher, hccl, env)
    spec["trainer"] = trainer
    try:
        AscendTrainJobSpec.model_validate(spec)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, f"{source}:{launch.line}", prefix=("spec",))) from None
    metadata: dict[str, Any] = {"name": name or job_name(source)}
    if namespace:
        metadata["namespace"] = namespace
    manifest = {"apiVersion": TRAIN_JOB.api_version, "kind": TRAIN_JOB.kind, "metadata": metadata, "spec": spec}
    paths = list(dict.fromkeys(w for w in args if w.startswith("/")))
    gaps = [f"variables used but not set in the script: {', '.join('$' + v for v in script.unset)} "
            "(give them with --set VAR=VALUE)"] if script.unset else []
    return ImportedJob(manifest, [], notes + env_notes, paths, gaps)
