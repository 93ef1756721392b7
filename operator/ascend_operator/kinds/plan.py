"""The memory plan of an AscendTrainJob: the engine's per-stage estimate (ascend_engine.plan.memory) against the
memory of the device its pods request (api.devices). One function for the three places that check it: ``ascend-train
plan`` / ``validate`` / ``apply`` (offline) and the operator when it admits a job (before any pod exists).
kube-apiserver cannot: the estimate is more arithmetic than a CEL rule's cost budget allows, and the device's memory
depends on the node selector and the operator's table."""
from __future__ import annotations

from typing import Any

from ascend_engine.plan.memory import WARN_FRACTION, MemoryPlan, backend_of, estimate, gib

from ..api.devices import CPU_OVERHEAD_BYTES, DEVICE_OVERHEAD_BYTES, device_memory

REFUSED = "InsufficientDeviceMemory"
NEAR = "NearDeviceMemory"


def job_plan(spec: Any) -> MemoryPlan | None:
    """The plan of a parsed AscendTrainJobSpec, None for a job without the engine's train (trainer, evaluation)."""
    if getattr(spec, "train", None) is None:
        return None
    name, memory = device_memory(spec.devices, spec.nodeSelector or {})
    overhead = CPU_OVERHEAD_BYTES if name is None else DEVICE_OVERHEAD_BYTES
    return estimate(spec.train, spec.world_size, device=name, device_bytes=memory, overhead_bytes=overhead,
                    backend=backend_of(spec.train, spec.devices.extended_resource()))


def refusal(plan: MemoryPlan | None) -> str | None:
    """Why the layout cannot fit (the largest stage's figures against the device's), or None."""
    if plan is None or plan.verdict != "exceeds":
        return None
    return (f"the layout does not fit the device's memory: {plan.summary()}; reduce the micro-batch or sequence, "
            f"raise tensor / pipeline parallelism, set useDistributedOptimizer or recomputeGranularity, or state "
            f"devices.memoryGiB if the device has more")


def warning(plan: MemoryPlan | None) -> str | None:
    if plan is None or plan.verdict != "near":
        return None
    return (f"the layout is near the device's memory (over {100 * WARN_FRACTION:.0f}%): {plan.summary()}; fragmentation "
            f"and communication buffers may not fit ({gib(plan.device_bytes - plan.largest.total_bytes)} GiB "
            f"left)")
