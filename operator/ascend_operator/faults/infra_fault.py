"""Pods that failed because of their node or device, not their job: the restart avoids that node.

A node fault is what Kubernetes says about the pod: the taint manager evicted it from a node that went NotReady
or unreachable (DisruptionTarget reason DeletionByTaintManager), or the pod garbage collector removed it from a
node that was deleted (DeletionByPodGC). A device fault is what the process said as it died: its termination
message (the engine's report, or the log's tail) names an accelerator error. The patterns are the errors that
mean "this chip or its link is bad", not "this program is wrong" (an out-of-memory or an illegal address is the
program's, and is left to the ordinary restart policy):

- Ascend (CANN/HCCL): "device error", CANN error codes of the driver, runtime and collective layers (EZ9999,
  EL0004, EE9999, EI0002, ...: 'E', a letter, four digits), HCCL errors, "ACL error" with a device status.
- NVIDIA (CUDA/NCCL/NVML): "uncorrectable ECC error", "GPU has fallen off the bus", "Xid", "CUDA error: unknown
  error" / "CUDA-capable device(s) ... unavailable", "NCCL error: unhandled system error", NVML "GPU is lost".
"""
from __future__ import annotations

import copy
import re
from typing import Any

NODE_FAULT_REASONS = ("DeletionByTaintManager", "DeletionByPodGC")
HOSTNAME_LABEL = "kubernetes.io/hostname"
DEVICE_ERRORS = re.compile("|".join([
    r"\bdevice error\b", r"\bE[A-Z]9999\b", r"\bE[ILZE]\d{4}\b.*(?:device|hccl|aicore|aicpu|driver|ring)",
    r"\bHCCL\b.*\b(?:error|timeout|fail)", r"\bACL error\b", r"\baicore (?:error|exception)\b",
    r"uncorrectable ECC", r"\bECC error\b", r"fallen off the bus", r"\bXid\b", r"CUDA error: unknown error",
    r"CUDA-capable device\(s\) is/are busy or unavailable", r"NCCL error.*unhandled (?:system|cuda) error",
    r"\bGPU is lost\b", r"\bNVML\b.*\b(?:error|lost)\b",
]), re.IGNORECASE)
MAX_QUOTE = 200


def node_name(pod: dict[str, Any]) -> str | None:
    return (pod.get("spec") or {}).get("nodeName") or None


def node_fault(pod: dict[str, Any]) -> str | None:
    """The cluster's word that the pod's node failed under it, or None."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "DisruptionTarget" and c.get("status") == "True" and c.get("reason") in NODE_FAULT_REASONS:
            return f"{c['reason']}: {c.get('message', '')}".rstrip(": ")
    return None


def device_fault(message: str | None) -> str | None:
    """The line of a termination message that names an accelerator fault, or None."""
    for line in reversed((message or "").splitlines()):
        if DEVICE_ERRORS.search(line):
            line = line.strip()
            return line if len(line) <= MAX_QUOTE else line[:MAX_QUOTE - 3] + "..."
    return None


def fault(pod: dict[str, Any]) -> tuple[str, str] | None:
    """("NodeFault" or "DeviceFault", why) for a pod that failed because of its node or device, else None."""
    if why := node_fault(pod):
        return "NodeFault", why
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (cs.get("state") or {}).get("terminated") or {}
        if terminated.get("exitCode") not in (None, 0) and (why := device_fault(terminated.get("message"))):
            return "DeviceFault", why
    return None


def avoid_nodes(objects: list[dict[str, Any]], nodes: list[str]) -> None:
    """Keep the rendered pods off ``nodes``: a required node affinity ``kubernetes.io/hostname NotIn``, added to
    each of the user's own node selector terms (terms are ORed, so each must exclude them) or as the only one."""
    if not nodes:
        return
    rule = {"key": HOSTNAME_LABEL, "operator": "NotIn", "values": sorted(set(nodes))}
    for pod in (o for o in objects if o.get("kind") == "Pod"):
        affinity = pod["spec"]["affinity"] = copy.deepcopy(pod["spec"].get("affinity") or {})  # not the spec's
        node_affinity = affinity.setdefault("nodeAffinity", {})
        required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
        terms = required.get("nodeSelectorTerms") or [{}]
        required["nodeSelectorTerms"] = [{**t, "matchExpressions": [*(t.get("matchExpressions") or []), rule]}
                                         for t in terms]
