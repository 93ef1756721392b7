"""Which accelerator each pod asks Kubernetes for. The engine's device module decides how to use it."""
from __future__ import annotations

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
