"""What a job says about the training runtime it uses (spec.runtimeRef) and what the operator recorded of it
(status.runtime). The runtime kinds themselves are in api/runtime.py."""
from __future__ import annotations

from typing import Any, Literal

from .kube import KubeModel, ObjectName, Passthrough
from typing import Annotated


class RuntimeRef(KubeModel):
    """A training runtime whose pod settings the job starts from; what the job sets itself wins."""

    kind: Literal["AscendTrainingRuntime", "ClusterAscendTrainingRuntime"] = "ClusterAscendTrainingRuntime"
    """AscendTrainingRuntime (in the job's namespace) or ClusterAscendTrainingRuntime (cluster-wide)."""
    name: ObjectName
    """The runtime's name."""


class RuntimeSnapshot(KubeModel):
    """The runtime as the operator resolved it when it first saw the job: every later pod (restarts, resizes,
    resumes) is rendered from this copy, so editing or deleting the runtime never changes a job that exists."""

    kind: str
    """The runtime's kind."""
    name: str
    """The runtime's name."""
    generation: int | None = None
    """The runtime's metadata.generation when it was resolved."""
    hash: str = ""
    """sha256 (first 16 hex digits) of the template used, to compare with the runtime now."""
    template: Annotated[dict[str, Any], Passthrough] = {}
    """The runtime's template as it was used."""
    lockedFields: list[str] = []
    """The runtime's lockedFields then (checked when the job was resolved)."""
