"""Pod security defaults for every job pod (what the Pod Security Standards' "restricted" level asks, apart from
running as non-root, which the Ascend driver images often cannot).

A spec that sets ``securityContext`` or ``podSecurityContext`` replaces the matching default as a whole: a
cluster that needs root or a capability for the NPU driver states exactly what it grants, and a merge could
produce contradictions the API server rejects (``privileged: true`` with ``allowPrivilegeEscalation: false``).
"""
from __future__ import annotations

from typing import Any

from ..api.kube import PodSettings

CONTAINER_DEFAULT = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                     "seccompProfile": {"type": "RuntimeDefault"}}
POD_DEFAULT = {"seccompProfile": {"type": "RuntimeDefault"}}


def container_security(settings: PodSettings) -> dict[str, Any]:
    return dict(settings.securityContext) if settings.securityContext else dict(CONTAINER_DEFAULT)


def pod_security(settings: PodSettings) -> dict[str, Any]:
    """The pod-level fields: securityContext and whether the service account token is mounted."""
    return {"securityContext": dict(settings.podSecurityContext) if settings.podSecurityContext else dict(POD_DEFAULT),
            "automountServiceAccountToken": settings.automountServiceAccountToken}
