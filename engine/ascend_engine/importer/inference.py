"""MindSpeed-LLM's evaluation and generation scripts: ``evaluate_*.sh`` launches ``evaluation.py``, which becomes
an AscendTrainJob with only ``evaluation`` (it scores ``--load``, results in ``status.evaluation``);
``generate_*.sh`` launches ``inference.py``, which becomes an ``ascend-engine generate`` command line.

Both read the model's shape and precision from the checkpoint's saved arguments (``--load``), so the script's
model and training flags are named, in one note, as taken from there rather than listed as not imported.
"""
from __future__ import annotations

import functools
import os
from typing import Any

from pydantic import ValidationError

from ..config.evaluate import EvaluateConfig
from ..config.loader import ConfigError, format_validation_error
from ..generate.config import GenerateConfig
from .launch import Launch
from .parts import ImportedJob, hccl_and_env, int_value, launch_shape, paths_named, pod_shape
from .shell import Script
from .train_flags import MappedFlags, map_flags, train_parser

EVALUATION_ENTRY, GENERATION_ENTRY = "evaluation.py", "inference.py"
FROM_CHECKPOINT = ("taken from the checkpoint (--load), whose saved arguments give the model's shape and precision "
                   "(training flags that inference does not need)")
_TASK_NAMES = {"human_eval": "humaneval"}  # MindSpeed-LLM's spelling -> the engine's


@functools.cache
def _train_flags() -> frozenset[str]:
    return frozenset(train_parser()._option_string_actions)  # noqa: SLF001 - argparse has no public lookup


def _train_flag(flag: str) -> bool:
    return flag in _train_flags()


def _map(flags: list[tuple[str, list[str]]], model: type) -> tuple[MappedFlags, list[str]]:
    """The script's flags on ``model``, and the note naming the training flags it has no field for (the
    checkpoint's saved arguments stand for them)."""
    mapped = map_flags(flags, model)
    from_checkpoint = [s for s in mapped.skipped if s.reason.startswith("no ") and _train_flag(s.flag)]
    mapped.skipped = [s for s in mapped.skipped if s not in from_checkpoint]
    words = " ".join(" ".join([s.flag, *s.values]) for s in from_checkpoint)
    return mapped, [f"{FROM_CHECKPOINT}: {words}"] if from_checkpoint else []


def import_inference(script: Script, launch: Launch, source: str, *, image: str, name: str,
                     namespace: str | None) -> Any:
    """The ImportedJob for an evaluation or generation launch; None for a training launch."""
    entry = os.path.basename(launch.entry_point)
    if entry == EVALUATION_ENTRY:
        return _evaluation(script, launch, source, image, name, namespace)
    if entry == GENERATION_ENTRY:
        return _generation(script, launch, source)
    return None


def _unset(script: Script) -> list[str]:
    return [f"variables used but not set in the script: {', '.join('$' + v for v in script.unset)} "
            "(give them with --set VAR=VALUE)"] if script.unset else []


def _evaluation(script: Script, launch: Launch, source: str, image: str, name: str, namespace: str | None):
    from ascend_operator.api.group import TRAIN_JOB
    from ascend_operator.api.train_job import AscendTrainJobSpec


    notes: list[str] = []
    flags = []
    for flag, values in launch.flags:
        if flag == "--task":
            renamed = [_TASK_NAMES.get(v, v) for v in values]
            notes += [f"--task {v}: the engine's name is {_TASK_NAMES[v]}" for v in values if v in _TASK_NAMES]
            values = renamed
        if flag == "--no-chat-template":  # the engine's default: plain few-shot text, no chat template
            notes.append("--no-chat-template: promptType empty (the engine's default)")
            continue
        flags.append((flag, values))
    mapped, from_checkpoint = _map(flags, EvaluateConfig)
    notes += from_checkpoint
    nproc, nnodes, shape_notes = launch_shape(launch.launcher, launch.line)
    hccl, env, env_notes = hccl_and_env(script)
    evaluation = mapped.data
    gaps = [f"no {what}: {flag} not resolved" for key, flag, what in (
        ("load", "--load", "checkpoint to evaluate"), ("tokenizerNameOrPath", "--tokenizer-name-or-path", "tokenizer"),
        ("task", "--task", "task"), ("taskDataPath", "--task-data-path", "task data")) if not evaluation.get(key)]
    gaps += _unset(script)
    spec = pod_shape(image, nnodes, nproc, launch.launcher, hccl, env)
    because = "".join(f"\n  likely because: {g}" for g in gaps)  # an unresolved variable, not the script
    where = f"{source}:{launch.line}"
    try:
        spec["evaluation"] = EvaluateConfig.model_validate(evaluation).model_dump(mode="json", by_alias=True,
                                                                                   exclude_unset=True)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, where, prefix=("spec", "evaluation")) + because) from None
    try:
        AscendTrainJobSpec.model_validate(spec)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, where, prefix=("spec",)) + because) from None
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    manifest = {"apiVersion": TRAIN_JOB.api_version, "kind": TRAIN_JOB.kind, "metadata": metadata, "spec": spec}
    return ImportedJob(manifest, mapped.skipped, shape_notes + notes + env_notes + _warnings(script, source),
                       paths_named(spec["evaluation"], mapped.skipped), gaps, no_effect=mapped.no_effect)


def _generation(script: Script, launch: Launch, source: str):

    layout = {"--tensor-model-parallel-size": 1, "--pipeline-model-parallel-size": 1}
    flags = []
    for flag, values in launch.flags:
        if flag in layout and values:  # the checkpoint's layout: generate runs TP x PP processes
            layout[flag] = int_value(values[0], flag, launch.line)
        else:
            flags.append((flag, values))
    mapped, notes = _map(flags, GenerateConfig)
    tp, pp = layout.values()
    devices = tp * pp
    notes.insert(0, f"generate runs at the checkpoint's own layout: {devices} process(es) for TP {tp} x PP {pp}")
    launched = int_value(launch.launcher.get("nproc-per-node") or "1", "--nproc_per_node", launch.line) * \
        int_value(launch.launcher.get("nnodes") or "1", "--nnodes", launch.line)
    if launched != devices:
        notes.append(f"the script launched {launched} process(es); generate needs exactly TP x PP = {devices}")
    gaps = [f"no {what}: {flag} not resolved" for key, flag, what in (
        ("load", "--load", "checkpoint"), ("tokenizerNameOrPath", "--tokenizer-name-or-path", "tokenizer"))
        if not mapped.data.get(key)] + _unset(script)
    if not gaps:
        try:
            GenerateConfig.model_validate(mapped.data)
        except ValidationError as e:
            raise ConfigError(format_validation_error(e, f"{source}:{launch.line}")) from None
    kept = {mapped.mapped[path] for path in mapped.mapped}
    argv = [word for flag, values in flags if flag in kept for word in (flag, *values)]
    command = ["torchrun", f"--nproc-per-node={devices}", "-m", "ascend_engine", "generate", *argv, "--prompt"]
    paths = [v for v in argv if v.startswith("/")]
    return ImportedJob({}, mapped.skipped, notes + _warnings(script, source), paths, gaps,
                       no_effect=mapped.no_effect, command_line=command)


def _warnings(script: Script, source: str) -> list[str]:
    return [f"{source}: {w}" for w in script.warnings]
