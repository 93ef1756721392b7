"""The cluster admin's policy on what job pods may take from the node (chart value ``jobPodPolicy``).

The CRD cannot know it (one CRD serves every installation), so the operator checks it when it reads a spec:
a job that asks for more fails with reason ``PolicyViolation`` and a message naming the field and the setting.
It covers what the Pod Security Standards cover for the fields a spec can set: hostNetwork, hostPath volumes,
privileged containers, added capabilities, privilege escalation and an unmasked /proc (hostPID, hostIPC and
hostPorts have no field in the spec, so no job can ask for them). Mounts over the paths the engine itself
uses (its config, /dev/shm, the termination message) are refused whatever the policy says: the engine would
read the wrong config or lose its failure report.
"""
from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from .. import settings
from ..render.common import CONFIG_MOUNT, TERMINATION_LOG


def denied(spec: Any) -> str | None:
    """Why the policy refuses ``spec``, or None."""
    if getattr(spec, "hostNetwork", False) and not settings.ALLOW_HOST_NETWORK:
        return ("spec.hostNetwork: Forbidden: this operator's policy denies hostNetwork pods "
                "(chart value jobPodPolicy.allowHostNetwork is false)")
    for index, volume in enumerate(spec.volumes):
        if "hostPath" in volume and not settings.ALLOW_HOST_PATH:
            return (f"spec.volumes[{index}] ({volume.get('name')}): Forbidden: hostPath volumes are denied by this "
                    "operator's policy (chart value jobPodPolicy.allowHostPath is false); use a PersistentVolumeClaim")
    return _security_context_denied(spec.securityContext or {}) or _engine_paths_shadowed(spec)


def _security_context_denied(context: dict[str, Any]) -> str | None:
    field = "spec.securityContext"
    if context.get("privileged") is True and not settings.ALLOW_PRIVILEGED:
        return (f"{field}.privileged: Forbidden: this operator's policy denies privileged containers "
                "(chart value jobPodPolicy.allowPrivileged is false)")
    added = (context.get("capabilities") or {}).get("add") or []
    refused = [c for c in added if str(c).upper().removeprefix("CAP_") not in settings.ALLOWED_CAPABILITIES]
    if refused:
        allowed = ", ".join(sorted(settings.ALLOWED_CAPABILITIES)) or "none"
        return (f"{field}.capabilities.add: Forbidden: this operator's policy denies adding {', '.join(refused)} "
                f"(chart value jobPodPolicy.allowedCapabilities allows: {allowed})")
    if context.get("allowPrivilegeEscalation") is True and not settings.ALLOW_PRIVILEGE_ESCALATION:
        return (f"{field}.allowPrivilegeEscalation: Forbidden: this operator's policy denies privilege escalation "
                "(chart value jobPodPolicy.allowPrivilegeEscalation is false)")
    if context.get("procMount") not in (None, "Default") and not settings.ALLOW_UNMASKED_PROC_MOUNT:
        return (f"{field}.procMount: Forbidden: this operator's policy denies procMount {context['procMount']} "
                "(chart value jobPodPolicy.allowUnmaskedProcMount is false)")
    if (context.get("windowsOptions") or {}).get("hostProcess") is True:
        return f"{field}.windowsOptions.hostProcess: Forbidden: host process containers are never allowed"
    return None


def _engine_paths_shadowed(spec: Any) -> str | None:
    """A volumeMount at, above or inside a path the engine's container needs."""
    engine = [CONFIG_MOUNT, TERMINATION_LOG] + (["/dev/shm"] if spec.shmSize else [])
    for index, mount in enumerate(spec.volumeMounts):
        at = PurePosixPath(str(mount.get("mountPath", "")))
        for path in map(PurePosixPath, engine):
            if at == path or at in path.parents or path in at.parents:
                return (f"spec.volumeMounts[{index}].mountPath: Forbidden: {at} is over {path}, which the operator "
                        "mounts for the engine (its config, /dev/shm and the termination message); mount elsewhere")
    return None
