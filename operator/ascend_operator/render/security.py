"""Pod security defaults for every job pod (what the Pod Security Standards' "restricted" level asks, apart from
running as non-root, which the Ascend driver images often cannot).

A spec that sets ``securityContext`` or ``podSecurityContext`` replaces the matching default as a whole: a
cluster that needs root or a capability for the NPU driver states exactly what it grants, and a merge could
produce contradictions the API server rejects (``privileged: true`` with ``allowPrivilegeEscalation: false``).
The one exception is ``allowPrivilegeEscalation``, false where the stated context says nothing and allows it.
What a stated context may grant at all is the chart's ``jobPodPolicy`` (kinds/pod_policy.py).
"""
from __future__ import annotations

from typing import Any

from ..api.kube import PodSettings

CONTAINER_DEFAULT = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                     "seccompProfile": {"type": "RuntimeDefault"}}
POD_DEFAULT = {"seccompProfile": {"type": "RuntimeDefault"}}


def container_security(settings: PodSettings) -> dict[str, Any]:
    """The stated context, with ``allowPrivilegeEscalation: false`` where it says nothing (Kubernetes' own
    default is true) unless privileged or CAP_SYS_ADMIN implies escalation (the API server refuses false then)."""
    if not settings.securityContext:
        return dict(CONTAINER_DEFAULT)
    context = dict(settings.securityContext)
    added = {str(c).upper().removeprefix("CAP_") for c in (context.get("capabilities") or {}).get("add") or []}
    if "allowPrivilegeEscalation" not in context and not context.get("privileged") and "SYS_ADMIN" not in added:
        context["allowPrivilegeEscalation"] = False
    return context


def pod_security(settings: PodSettings) -> dict[str, Any]:
    """The pod-level fields: securityContext and whether the service account token is mounted."""
    return {"securityContext": dict(settings.podSecurityContext) if settings.podSecurityContext else dict(POD_DEFAULT),
            "automountServiceAccountToken": settings.automountServiceAccountToken}
