"""Assemble an AscendTrainJob from an evaluated launch script, and say what was left behind."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..config.loader import ConfigError, format_validation_error
from ..config.train import TrainConfig
from .fidelity import gaps
from .launch import find_launch
from .shell import Script, ScriptError, read_script
from .tools import import_tool, tool_of
from .train_flags import Skipped, map_flags

# Environment the operator sets on every pod from the spec: a script's values would be wrong in a cluster.
_SET_BY_OPERATOR = {"MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "WORLD_SIZE", "NPROC_PER_NODE",
                    "NPUS_PER_NODE", "GPUS_PER_NODE", "HCCL_CONNECT_TIMEOUT", "HCCL_IF_BASE_PORT",
                    "HCCL_SOCKET_IFNAME"}
# torchrun options the pod contract provides per pod (rank, rendezvous address).
_LAUNCHER_PER_POD = {"node-rank", "master-addr", "rdzv-endpoint", "rdzv-backend", "rdzv-id"}
DEFAULT_IMAGE = "ascend-train/engine-ascend:0.1.0"


@dataclass
class ImportedJob:
    manifest: dict[str, Any]
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # commands and variables not carried over, and why
    paths: list[str] = field(default_factory=list)  # absolute paths the job reads or writes: mount them
    gaps: list[str] = field(default_factory=list)  # why the job would not train what the script trains
    tools: list[dict[str, Any]] = field(default_factory=list)  # DatasetPrep / CheckpointConvert, in script order
    no_effect: list[str] = field(default_factory=list)  # acceleration switches (accelerations.py), as written
    command_line: list[str] | None = None  # a generation script: the ascend-engine generate command, not a resource

    @property
    def documents(self) -> list[dict[str, Any]]:
        """Everything to apply, in the script's order: tools first (they run before training), then the job."""
        return self.tools + ([self.manifest] if self.manifest else [])

    def mapped_count(self) -> int:
        return _count_leaves(self.manifest["spec"]["train"])


def _count_leaves(node: Any) -> int:
    return sum(_count_leaves(v) for v in node.values()) if isinstance(node, dict) else 1


def job_name(script_path: str) -> str:
    """``tune_qwen3_14b_4K_full_ptd.sh`` -> ``tune-qwen3-14b-4k-full-ptd``: a DNS-1035 label (a letter first, as
    the Service named after the job needs); ``002_l330.sh`` -> ``job-002-l330``."""
    name = re.sub(r"[^a-z0-9-]+", "-", Path(script_path).stem.lower()).strip("-")
    if name and not name[0].isalpha():
        name = f"job-{name}"
    return (name or "imported-job")[:63].rstrip("-")


def _int(text: str, what: str, line: int) -> int:
    try:
        return int(text)
    except ValueError:
        raise ScriptError(f"line {line}: {what} must be an integer, got {text!r}") from None


def _launch_shape(launcher: dict[str, str], line: int) -> tuple[int, int, list[str]]:
    notes = []
    nproc_text = launcher.get("nproc-per-node") or "1"
    nnodes_text = launcher.get("nnodes") or "1"
    if ":" in nnodes_text:  # elastic min:max
        notes.append(f"torchrun --nnodes {nnodes_text}: elastic ranges are not imported; using the maximum")
        nnodes_text = nnodes_text.split(":")[-1]
    for name in sorted(set(launcher) & _LAUNCHER_PER_POD):
        notes.append(f"torchrun --{name} {launcher[name]}: set per pod by the operator")
    for name in sorted(set(launcher) - _LAUNCHER_PER_POD - {"nproc-per-node", "nnodes", "master-port"}):
        notes.append(f"torchrun --{name} {launcher[name]}: not imported")
    return _int(nproc_text, "--nproc_per_node", line), _int(nnodes_text, "--nnodes", line), notes


def _hccl_and_env(script: Script) -> tuple[dict[str, Any], list[dict[str, str]], list[str]]:
    hccl: dict[str, Any] = {}
    env: list[dict[str, str]] = []
    notes: list[str] = []
    v = script.variables
    for name in script.exported:
        value = v.get(name, "")
        if name == "HCCL_CONNECT_TIMEOUT":
            hccl["connectTimeout"] = int(value)
        elif name == "HCCL_IF_BASE_PORT":
            hccl["ifBasePort"] = int(value)
        elif name == "HCCL_SOCKET_IFNAME":
            hccl["socketIfname"] = value
        elif name in _SET_BY_OPERATOR:
            notes.append(f"export {name}={value}: set per pod by the operator")
        else:
            env.append({"name": name, "value": value})
    return hccl, env, notes


def _pod_shape(image: str, nnodes: int, nproc: int, launcher: dict[str, str], hccl: dict[str, Any],
               env: list[dict[str, str]]) -> dict[str, Any]:
    """The spec's pod part, the same whether the script is translated or kept as it is."""
    spec: dict[str, Any] = {"image": image, "nnodes": nnodes, "nprocPerNode": nproc}
    master_port = launcher.get("master-port")
    if master_port and master_port.isdigit() and int(master_port) >= 1024:
        spec["masterPort"] = int(master_port)
    if hccl:
        spec["hccl"] = hccl
    if env:
        spec["env"] = env
    return spec


def _paths(train: dict[str, Any], skipped: list[Skipped]) -> list[str]:
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, str) and node.startswith("/") and node not in found:
            found.append(node)

    walk(train)
    walk([value for s in skipped for value in s.values])
    return found


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
        nproc, nnodes, notes = _launch_shape(launch.launcher, launch.line)
        from .inference import import_inference  # evaluation.py / inference.py launches

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
    hccl, env, env_notes = _hccl_and_env(script)
    notes += env_notes

    try:
        train = TrainConfig.model_validate(mapped.data)
    except ValidationError as e:
        raise ConfigError(f"{source}: the script's training flags do not make a valid config:\n"
                          + format_validation_error(e, f"{source}:{launch.line}", prefix=("train",))) from None
    spec = _pod_shape(image, nnodes, nproc, launch.launcher, hccl, env)
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
    return ImportedJob(manifest, mapped.skipped, notes, _paths(spec["train"], mapped.skipped), lost, tools,
                       mapped.no_effect)
