"""Which accelerator each pod asks Kubernetes for. The engine's device module decides how to use it."""
from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field

from ascend_engine.config.base import not_null

from .kube import KubeModel

ASCEND_910 = "huawei.com/Ascend910"
NO_DEVICE = "none"


class DeviceSettings(KubeModel):
    """The extended resource requested per pod (nprocPerNode of them) and the Ascend scheduling hints."""

    resource: Annotated[str, Field(pattern=r"^(none|[a-z0-9.-]+/[A-Za-z0-9._-]+)$"), not_null("none for CPU pods")] = (
        ASCEND_910)
    """Extended resource name: huawei.com/Ascend910, huawei.com/npu, a vNPU such as huawei.com/Ascend910-4c,
    nvidia.com/gpu, or `none` for CPU-only pods (an explicit value: a null would be replaced by the default)."""
    ringController: Annotated[str, not_null('"" to omit the label')] = "ascend-910b"
    """Value of the `ring-controller.atlas` label the Ascend device plugin and Volcano look for ("" omits it)."""

    def extended_resource(self) -> str | None:
        """The resource name each pod requests, None for CPU pods."""
        return None if self.resource == NO_DEVICE else self.resource

    def is_ascend(self) -> bool:
        return self.resource.startswith("huawei.com/")


class TrainDeviceSettings(DeviceSettings):
    """An AscendTrainJob's devices: the resource, and the memory its plan is checked against."""

    memoryGiB: Annotated[float | None, Field(gt=0)] = None
    """Memory of one device in GiB, for the plan checked before the pods are created (docs/plan.md); default: from
    the resource and the node selector (910B 64, 910B4 and 910A 32, GPUs by nvidia.com/gpu.product). Set it for
    a device the table does not know (a vNPU, another GPU)."""


class CpuDeviceSettings(DeviceSettings):
    """Devices of a one-pod engine job: CPU unless told otherwise, also when `devices: {}` is written."""

    resource: Annotated[str, Field(pattern=r"^(none|[a-z0-9.-]+/[A-Za-z0-9._-]+)$"), not_null("none for CPU pods")] = (
        NO_DEVICE)
    """Extended resource name (huawei.com/Ascend910, nvidia.com/gpu, ...) or `none` for a CPU pod."""
    ringController: Annotated[str, not_null('"" to omit the label')] = ""
    """Value of the `ring-controller.atlas` label ("" omits it)."""


class HcclSettings(KubeModel):
    """HCCL (Ascend collective communication) environment, set on every pod when the devices are Ascend."""

    connectTimeout: Annotated[int, Field(ge=120, le=7200)] = 1200
    """HCCL_CONNECT_TIMEOUT in seconds."""
    ifBasePort: Annotated[int | None, Field(ge=1024, le=65000)] = None
    """HCCL_IF_BASE_PORT: first port of HCCL's range (set it when pods share a host network)."""
    socketIfname: str | None = None
    """HCCL_SOCKET_IFNAME, e.g. eth0 or enp."""


# -- device memory: what one device of a job's pods holds, for the plan (ascend_engine.plan.memory) ----------------

GIB = 1024 ** 3
ASCEND_CHIP_LABELS = ("node.kubernetes.io/npu.chip.name", "accelerator-type", "accelerator")
"""Node labels (as a job's nodeSelector names them) whose value says which Ascend chip a node has."""
ASCEND_MEMORY_GIB = (("910b4", 32), ("910b", 64), ("910a", 32), ("910pro", 32), ("ascend-910", 32))
"""Substrings of a chip name, most specific first (ringController ascend-910 is the 910A's Volcano ring)."""
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MEMORY_GIB = (("h200", 141), ("h100", 80), ("h800", 80), ("a800", 80), ("l40", 48), ("a10", 24), ("l4", 24),
                  ("t4", 16))
"""GPU products whose label does not name the memory (a label such as NVIDIA-A100-SXM4-40GB does: that wins)."""
CPU_OVERHEAD_BYTES = 0
DEVICE_OVERHEAD_BYTES = 2 * GIB
"""The fixed share the plan adds per accelerator for what the layout does not decide: the CANN / CUDA context,
HCCL / NCCL buffers of the default sizes and the caching allocator's slack (stated in docs/plan.md)."""


def device_memory(devices: DeviceSettings, node_selector: dict[str, str]) -> tuple[str | None, int | None]:
    """(device name, bytes of memory) of one device of the job's pods; (None, None) for CPU pods, (name, None)
    for a device whose memory the table does not know."""
    resource = devices.extended_resource()
    if resource is None:
        return None, None
    if getattr(devices, "memoryGiB", None):
        return resource, int(devices.memoryGiB * GIB)
    if devices.is_ascend():
        if "-" in resource.split("/", 1)[1]:  # a vNPU (huawei.com/Ascend910-4c): its share depends on the template
            return resource, None
        chip = next((node_selector[k] for k in ASCEND_CHIP_LABELS if k in node_selector), devices.ringController)
        name = (chip or "ascend-910b").lower()
        gib = next((g for key, g in ASCEND_MEMORY_GIB if key in name), 64)
        label = chip.upper().replace("ASCEND-", "") if chip else "910B"
        return f"Ascend {label}", gib * GIB
    if resource == "nvidia.com/gpu":
        product = node_selector.get(GPU_PRODUCT_LABEL)
        if not product:
            return "nvidia.com/gpu (no nvidia.com/gpu.product in nodeSelector)", None
        named = re.search(r"(\d+)\s*GB", product, re.IGNORECASE)
        gib = int(named.group(1)) if named else next((g for key, g in GPU_MEMORY_GIB if key in product.lower()),
                                                      None)
        return product, None if gib is None else gib * GIB
    return resource, None
