"""kube-apiserver's rules for a container's ``env`` and ``envFrom`` (``ValidateEnv``, ``validateEnvFrom`` in
pkg/apis/core/validation), in its words: names, one source per ``valueFrom``, the downward API's field and resource
paths, and the names and keys of referenced ConfigMaps and Secrets. A job's ``env`` and ``envFrom`` reach its pods
unchanged (the operator's own variables beside them), so these decide whether its pods can exist."""
from __future__ import annotations

import re
from typing import Any

from .core_object_rules import config_key_messages
from .label_rules import qualified_name_errors, quoted as _q
from .object_names import format_errors

Errors = list[tuple[str, str]]

# 1.32 has RelaxedEnvironmentVariableValidation on (beta): env names and envFrom prefixes are any printable ASCII
# but '='.
_ENV_NAME = "[ -<>-~]+"
_ENV_NAME_MESSAGE = "a valid environment variable name must consist only of printable ASCII characters other than '='"
_SOURCES = ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef")
# What the downward API can convert (ConvertDownwardAPIFieldLabel), and of those what an env var may read.
_CONVERTIBLE = ("metadata.annotations", "metadata.labels", "metadata.name", "metadata.namespace", "metadata.uid",
                "spec.nodeName", "spec.restartPolicy", "spec.serviceAccountName", "spec.schedulerName",
                "status.phase", "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs")
_ENV_FIELDS = ("metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName", "spec.serviceAccountName",
               "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs")
_RESOURCE_FIELDS = ("limits.cpu", "limits.ephemeral-storage", "limits.memory", "requests.cpu",
                    "requests.ephemeral-storage", "requests.memory")
_SUBSCRIPTED = re.compile(r"(metadata\.(?:annotations|labels))\['(.*)'\]")


def _name_errors(field: str, name: str) -> Errors:
    return [(field, f"{field}: Invalid value: {_q(name)}: {m}") for m in format_errors(name, "dns1123-subdomain")]


def _config_key_errors(field: str, key: str) -> Errors:
    return [(field, f"{field}: Invalid value: {_q(key)}: {m}") for m in config_key_messages(key)]


def _field_ref_errors(at: str, ref: dict[str, Any]) -> Errors:
    """``validateObjectFieldSelector`` with the fields an env var may read (apiVersion defaults to v1)."""
    version, path = ref.get("apiVersion") or "v1", ref.get("fieldPath") or ""
    if not path:
        return [(f"{at}.fieldPath", f"{at}.fieldPath: Required value")]
    subscripted = _SUBSCRIPTED.fullmatch(path)
    if version != "v1":
        why = f"unsupported pod version: {version}"
    elif not subscripted and path not in _CONVERTIBLE:
        why = f"field label not supported: {path}"
    else:
        why = ""
    if why:
        return [(f"{at}.fieldPath", f"{at}.fieldPath: Invalid value: {_q(path)}: error converting fieldPath: {why}")]
    if subscripted:
        key = subscripted.group(2)
        return qualified_name_errors(at, key.lower() if subscripted.group(1) == "metadata.annotations" else key)
    if path not in _ENV_FIELDS:
        return [(f"{at}.fieldPath", f"{at}.fieldPath: Unsupported value: {_q(path)}: supported values: "
                                    + ", ".join(_q(f) for f in sorted(_ENV_FIELDS)))]
    return []


def _resource_ref_errors(at: str, ref: dict[str, Any]) -> Errors:
    resource = ref.get("resource") or ""
    if not resource:
        return [(f"{at}.resource", f"{at}.resource: Required value")]
    if resource not in _RESOURCE_FIELDS and not resource.startswith(("requests.hugepages-", "limits.hugepages-")):
        return [(f"{at}.resource", f"{at}.resource: Unsupported value: {_q(resource)}: supported values: "
                                   + ", ".join(_q(f) for f in _RESOURCE_FIELDS))]
    return []


def _key_ref_errors(at: str, ref: dict[str, Any]) -> Errors:
    """``validateConfigMapKeySelector`` / ``validateSecretKeySelector``: a DNS-1123 name, a config key."""
    errors = _name_errors(f"{at}.name", ref.get("name") or "")
    key = ref.get("key") or ""
    return errors + (_config_key_errors(f"{at}.key", key) if key else [(f"{at}.key", f"{at}.key: Required value")])


def env_errors(at: str, container: dict[str, Any]) -> Errors:
    """``env`` and ``envFrom`` of one container (``at``: ``spec.containers[i]``)."""
    errors: Errors = []
    for e, env in enumerate(container.get("env") or []):
        here = f"{at}.env[{e}]"
        name = env.get("name") or ""
        if not name:
            errors.append((f"{here}.name", f"{here}.name: Required value"))
        elif not re.fullmatch(_ENV_NAME, name):
            errors.append((f"{here}.name", f"{here}.name: Invalid value: {_q(name)}: {_ENV_NAME_MESSAGE}"))
        source = env.get("valueFrom")
        if source is None:
            continue
        given = [s for s in _SOURCES if source.get(s) is not None]
        if env.get("value"):
            errors.append((f"{here}.valueFrom", f'{here}.valueFrom: Invalid value: "": may not be specified when '
                                                "`value` is not empty"))
        if not given:
            errors.append((f"{here}.valueFrom", f'{here}.valueFrom: Invalid value: "": must specify one of: '
                                                "`fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`"))
        elif len(given) > 1:
            errors.append((f"{here}.valueFrom", f'{here}.valueFrom: Invalid value: "": may not have more than one '
                                                "field specified at a time"))
        check = {"fieldRef": _field_ref_errors, "resourceFieldRef": _resource_ref_errors,
                 "configMapKeyRef": _key_ref_errors, "secretKeyRef": _key_ref_errors}
        for kind in given:
            errors += check[kind](f"{here}.valueFrom.{kind}", source[kind])
    for e, source in enumerate(container.get("envFrom") or []):
        here = f"{at}.envFrom[{e}]"
        if source.get("prefix") and not re.fullmatch(_ENV_NAME, source["prefix"]):
            errors.append((f"{here}.prefix", f"{here}.prefix: Invalid value: {_q(source['prefix'])}: "
                                             f"{_ENV_NAME_MESSAGE}"))
        given = [k for k in ("configMapRef", "secretRef") if source.get(k) is not None]
        if not given:
            errors.append((here, f'{here}: Invalid value: "": must specify one of: `configMapRef` or `secretRef`'))
        elif len(given) > 1:
            errors.append((here, f'{here}: Invalid value: "": may not have more than one field specified at a time'))
        for kind in given:
            name = source[kind].get("name") or ""
            errors += _name_errors(f"{here}.{kind}.name", name) if name else \
                [(f"{here}.{kind}.name", f"{here}.{kind}.name: Required value")]
    return errors
