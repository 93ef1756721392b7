"""The cluster admin's policy on what job pods may take from the node (chart value ``jobPodPolicy``).

The CRD cannot know it (one CRD serves every installation), so the operator checks it when it reads a spec:
a job that asks for more fails with reason ``PolicyViolation`` and a message naming the field and the setting.
"""
from __future__ import annotations

from typing import Any

from .. import settings


def denied(spec: Any) -> str | None:
    """Why the policy refuses ``spec``, or None."""
    if getattr(spec, "hostNetwork", False) and not settings.ALLOW_HOST_NETWORK:
        return ("spec.hostNetwork: Forbidden: this operator's policy denies hostNetwork pods "
                "(chart value jobPodPolicy.allowHostNetwork is false)")
    for index, volume in enumerate(spec.volumes):
        if "hostPath" in volume and not settings.ALLOW_HOST_PATH:
            return (f"spec.volumes[{index}] ({volume.get('name')}): Forbidden: hostPath volumes are denied by this "
                    "operator's policy (chart value jobPodPolicy.allowHostPath is false); use a PersistentVolumeClaim")
    return None
