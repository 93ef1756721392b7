"""Which accelerator each pod asks Kubernetes for. The engine's device module decides how to use it."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

from .kube import KubeModel

ASCEND_910 = "huawei.com/Ascend910"


class DeviceSettings(KubeModel):
    """The extended resource requested per pod (nprocPerNode of them) and the Ascend scheduling hints."""

    resource: Annotated[str | None, Field(pattern=r"^[a-z0-9.-]+/[A-Za-z0-9._-]+$")] = ASCEND_910
    """Extended resource name: huawei.com/Ascend910, huawei.com/npu, a vNPU such as huawei.com/Ascend910-4c,
    nvidia.com/gpu, or null for CPU-only pods."""
    ringController: str | None = "ascend-910b"
    """Value of the `ring-controller.atlas` label the Ascend device plugin and Volcano look for (null omits it)."""

    def is_ascend(self) -> bool:
        return bool(self.resource and self.resource.startswith("huawei.com/"))


class HcclSettings(KubeModel):
    """HCCL (Ascend collective communication) environment, set on every pod when the devices are Ascend."""

    connectTimeout: Annotated[int, Field(ge=120, le=7200)] = 1200
    """HCCL_CONNECT_TIMEOUT in seconds."""
    ifBasePort: Annotated[int | None, Field(ge=1024, le=65000)] = None
    """HCCL_IF_BASE_PORT: first port of HCCL's range (set it when pods share a host network)."""
    socketIfname: str | None = None
    """HCCL_SOCKET_IFNAME, e.g. eth0 or enp."""
