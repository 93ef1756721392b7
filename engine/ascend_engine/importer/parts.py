"""The parts of an imported job every kind of launch script shares (training, evaluation, a script kept as it is):
the job's record, its pod shape from torchrun's flags, HCCL settings and environment from the script's exports, and
the absolute paths it names."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .shell import Script, ScriptError
from .train_flags import Skipped

# Environment the operator sets on every pod from the spec: a script's values would be wrong in a cluster.
SET_BY_OPERATOR = {"MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "WORLD_SIZE", "NPROC_PER_NODE",
                    "NPUS_PER_NODE", "GPUS_PER_NODE", "HCCL_CONNECT_TIMEOUT", "HCCL_IF_BASE_PORT",
                    "HCCL_SOCKET_IFNAME"}
# torchrun options the pod contract provides per pod (rank, rendezvous address).
LAUNCHER_PER_POD = {"node-rank", "master-addr", "rdzv-endpoint", "rdzv-backend", "rdzv-id"}
DEFAULT_IMAGE = "ascend-train/engine-ascend:0.1.0"
# The chart's ClusterAscendTrainingRuntime for what a MindSpeed-LLM script runs on (Ascend 910B, HCCL) with the
# engine's image: a translated script's pods are exactly its pods, so the job names it instead of the image.
DEFAULT_RUNTIME = "ascend-910b"


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

    def name_runtime(self, runtime: str) -> None:
        """Every resource that runs the engine's default image names ``runtime`` (a ClusterAscendTrainingRuntime)
        instead: the image, devices and HCCL come from it; what the script set itself stays as the job's own."""
        for doc in self.documents:
            spec = doc["spec"]
            if spec.get("image") == DEFAULT_IMAGE:
                del spec["image"]
                doc["spec"] = {"runtimeRef": {"name": runtime}, **spec}

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


def int_value(text: str, what: str, line: int) -> int:
    try:
        return int(text)
    except ValueError:
        raise ScriptError(f"line {line}: {what} must be an integer, got {text!r}") from None


def launch_shape(launcher: dict[str, str], line: int) -> tuple[int, int, list[str]]:
    notes = []
    nproc_text = launcher.get("nproc-per-node") or "1"
    nnodes_text = launcher.get("nnodes") or "1"
    if ":" in nnodes_text:  # elastic min:max
        notes.append(f"torchrun --nnodes {nnodes_text}: elastic ranges are not imported; using the maximum")
        nnodes_text = nnodes_text.split(":")[-1]
    for name in sorted(set(launcher) & LAUNCHER_PER_POD):
        notes.append(f"torchrun --{name} {launcher[name]}: set per pod by the operator")
    for name in sorted(set(launcher) - LAUNCHER_PER_POD - {"nproc-per-node", "nnodes", "master-port"}):
        notes.append(f"torchrun --{name} {launcher[name]}: not imported")
    return int_value(nproc_text, "--nproc_per_node", line), int_value(nnodes_text, "--nnodes", line), notes


def hccl_and_env(script: Script) -> tuple[dict[str, Any], list[dict[str, str]], list[str]]:
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
        elif name in SET_BY_OPERATOR:
            notes.append(f"export {name}={value}: set per pod by the operator")
        else:
            env.append({"name": name, "value": value})
    return hccl, env, notes


def pod_shape(image: str, nnodes: int, nproc: int, launcher: dict[str, str], hccl: dict[str, Any],
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


def paths_named(train: dict[str, Any], skipped: list[Skipped]) -> list[str]:
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
