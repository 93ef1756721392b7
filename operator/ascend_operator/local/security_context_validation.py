"""kube-apiserver's rules for a Pod's and a container's security context (``ValidateSecurityContext``,
``validatePodSpecSecurityContext`` in pkg/apis/core/validation), in its words: user and group ids, ``procMount``,
seccomp and AppArmor profiles, ``allowPrivilegeEscalation: false`` against what contradicts it, sysctls and
``fsGroupChangePolicy``. A job's ``securityContext`` and ``podSecurityContext`` reach its pods unchanged (after the
chart's ``jobPodPolicy`` allowed them), so these decide whether its pods can exist.

Differs from a real API server: ``windowsOptions`` and ``seLinuxOptions`` are not checked (Linux pods only), and
``hostUsers`` is taken as unset (true), as a job's pods never set it.
"""
from __future__ import annotations

import json
import posixpath
import re
from typing import Any

from .label_rules import quoted as _q, unsupported

Errors = list[tuple[str, str]]

_ID_MAX = 2147483647
_PROFILE_TYPES = ("Localhost", "RuntimeDefault", "Unconfined")
_PROC_MOUNTS = ("Default", "Unmasked")
_FS_GROUP_CHANGE_POLICIES = ("OnRootMismatch", "Always")
_SYSCTL_SEGMENT = "[a-z0-9]([-_a-z0-9]*[a-z0-9])?"
_SYSCTL = rf"({_SYSCTL_SEGMENT}[\./])*{_SYSCTL_SEGMENT}"



def id_errors(field: str, context: dict[str, Any] | None, keys: tuple[str, ...]) -> Errors:
    errors = []
    for key in keys:
        ids = (context or {}).get(key)
        for number in ids if isinstance(ids, list) else [ids]:
            if isinstance(number, int) and not 0 <= number <= _ID_MAX:
                errors.append((f"{field}.{key}", f"{field}.{key}: Invalid value: {number}: must be between 0 and "
                                                 f"{_ID_MAX}, inclusive"))
    return errors


def _seccomp_errors(at: str, profile: dict[str, Any] | None) -> Errors:
    if profile is None:
        return []
    kind, local = profile.get("type") or "", profile.get("localhostProfile")
    if not kind:
        return [(f"{at}.type", f"{at}.type: Required value: type is required when seccompProfile is set")]
    if kind not in _PROFILE_TYPES:
        return [unsupported(f"{at}.type", kind, _PROFILE_TYPES)]
    field = f"{at}.localhostProfile"
    if kind == "Localhost":
        if not local:
            return [(field, f"{field}: Required value: must be set when seccomp type is Localhost")]
        errors = [(field, f"{field}: Invalid value: {_q(local)}: must be a relative path")] \
            if posixpath.isabs(local) else []
        if ".." in local.split("/"):
            errors.append((field, f"{field}: Invalid value: {_q(local)}: must not contain '..'"))
        return errors
    if local is not None:
        return [(field, f"{field}: Invalid value: {json.dumps(profile)}: can only be set when seccomp type is "
                        "Localhost")]
    return []


def _app_armor_errors(at: str, profile: dict[str, Any] | None) -> Errors:
    if profile is None:
        return []
    kind, local = profile.get("type") or "", profile.get("localhostProfile")
    field = f"{at}.localhostProfile"
    if kind == "Localhost":
        if local is None or local == "":
            return [(field, f"{field}: Required value: must be set when AppArmor type is Localhost")]
        if local.strip() != local:
            return [(field, f"{field}: Invalid value: {_q(local)}: must not be padded with whitespace")]
        if len(local) > 4095:
            return [(field, f"{field}: Too long: may not be more than 4095 bytes")]
        return []
    if kind in ("RuntimeDefault", "Unconfined"):
        return [] if local is None else \
            [(field, f"{field}: Invalid value: {_q(local)}: can only be set when AppArmor type is Localhost")]
    if not kind:
        return [(f"{at}.type", f"{at}.type: Required value: type is required when appArmorProfile is set")]
    return [unsupported(f"{at}.type", kind, _PROFILE_TYPES)]


def container_context_errors(at: str, context: dict[str, Any] | None) -> Errors:
    """A container's ``securityContext`` (``at``: ``spec.containers[i].securityContext``)."""
    if not context:
        return []
    errors = id_errors(at, context, ("runAsUser", "runAsGroup"))
    proc = context.get("procMount")
    if proc is not None:
        if proc not in _PROC_MOUNTS:
            errors.append(unsupported(f"{at}.procMount", proc, _PROC_MOUNTS))
        elif proc == "Unmasked":  # a job's pods keep the host's user namespace (hostUsers unset: true)
            errors.append((f"{at}.procMount", f"{at}.procMount: Forbidden: `hostUsers` must be false to use "
                                              "`Unmasked`"))
    errors += _seccomp_errors(f"{at}.seccompProfile", context.get("seccompProfile"))
    if context.get("allowPrivilegeEscalation") is False:
        shown = json.dumps(context, sort_keys=True)
        if context.get("privileged") is True:
            errors.append((at, f"{at}: Invalid value: {shown}: cannot set `allowPrivilegeEscalation` to false and "
                               "`privileged` to true"))
        if "CAP_SYS_ADMIN" in ((context.get("capabilities") or {}).get("add") or []):
            errors.append((at, f"{at}: Invalid value: {shown}: cannot set `allowPrivilegeEscalation` to false and "
                               "`capabilities.Add` CAP_SYS_ADMIN"))
    return errors + _app_armor_errors(f"{at}.appArmorProfile", context.get("appArmorProfile"))


def pod_context_errors(context: dict[str, Any] | None) -> Errors:
    """The pod's ``spec.securityContext``: ids, sysctls, fsGroupChangePolicy, seccomp and AppArmor."""
    at = "spec.securityContext"
    if not context:
        return []
    errors = id_errors(at, context, ("runAsUser", "runAsGroup", "fsGroup", "supplementalGroups"))
    seen: set[str] = set()
    for i, sysctl in enumerate(context.get("sysctls") or []):
        field, name = f"{at}.sysctls[{i}].name", sysctl.get("name") or ""
        if not name:
            errors.append((field, f"{field}: Required value"))
        elif len(name) > 253 or not re.fullmatch(_SYSCTL, name):
            errors.append((field, f"{field}: Invalid value: {_q(name)}: must have at most 253 characters and match "
                                  f"regex {_SYSCTL}"))
        elif name in seen:
            errors.append((field, f"{field}: Duplicate value: {_q(name)}"))
        seen.add(name)
    policy = context.get("fsGroupChangePolicy")
    if policy is not None and policy not in _FS_GROUP_CHANGE_POLICIES:
        errors.append(unsupported(f"{at}.fsGroupChangePolicy", policy, _FS_GROUP_CHANGE_POLICIES))
    errors += _seccomp_errors(f"{at}.seccompProfile", context.get("seccompProfile"))
    return errors + _app_armor_errors(f"{at}.appArmorProfile", context.get("appArmorProfile"))
