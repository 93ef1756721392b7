"""kube-apiserver's hand-written rules for the other built-in objects the operator and its users write
(``ValidateConfigMap``, ``ValidateSecret``, ``ValidateService``'s ports, ``ValidateLeaseSpec`` in pkg/apis), in
its words: ConfigMap and Secret keys and their 1 MiB limit, Service port numbers, Lease durations. Pods have
``pod_validation``; every object's metadata has ``object_meta``.

Differs from a real API server: Secret types' required keys (``kubernetes.io/dockerconfigjson`` and the rest) and
Service fields other than ports' numbers and names are not checked.
"""
from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from .label_rules import quoted as _q

Errors = list[tuple[str, str]]

MAX_DATA_BYTES = 1024 * 1024  # core.MaxSecretSize, also a ConfigMap's limit
_CONFIG_KEY = "[-._a-zA-Z0-9]+"
_CONFIG_KEY_MESSAGE = ("a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name', "
                       f" or 'KEY_NAME',  or 'key-name', regex used for validation is '{_CONFIG_KEY}')")


def config_key_messages(key: str) -> list[str]:
    """apimachinery's ``IsConfigMapKey``: what is wrong with a ConfigMap's, a Secret's or a key reference's key."""
    messages = []
    if len(key) > 253:
        messages.append("must be no more than 253 characters")
    if not re.fullmatch(_CONFIG_KEY, key):
        messages.append(_CONFIG_KEY_MESSAGE)
    if key in (".", ".."):
        messages.append(f"must not be '{key}'")
    elif key.startswith(".."):
        messages.append("must not start with '..'")
    return messages


def _key_errors(part: str, keys: Any) -> Errors:
    return [(f"{part}[{key}]", f"{part}[{key}]: Invalid value: {_q(key)}: {m}")
            for key in keys or () for m in config_key_messages(str(key))]


def _decoded_size(value: Any) -> int:
    try:
        return len(base64.b64decode(str(value or ""), validate=True))
    except (binascii.Error, ValueError):
        return len(str(value or ""))  # decoding reports it; the size is then a bound


def config_map_errors(obj: dict[str, Any]) -> Errors:
    data, binary = obj.get("data") or {}, obj.get("binaryData") or {}
    errors = _key_errors("data", data) + _key_errors("binaryData", binary)
    for key in set(data) & set(binary):
        errors.append((f"data[{key}]", f"data[{key}]: Invalid value: {_q(key)}: duplicate of key present in "
                                       "binaryData"))
        errors.append((f"binaryData[{key}]", f"binaryData[{key}]: Invalid value: {_q(key)}: duplicate of key "
                                             "present in data"))
    size = sum(len(str(v or "").encode()) for v in data.values()) + sum(_decoded_size(v) for v in binary.values())
    if size > MAX_DATA_BYTES:
        errors.append(("", f": Too long: must have at most {MAX_DATA_BYTES} bytes"))
    return errors


def secret_errors(obj: dict[str, Any]) -> Errors:
    """Keys of ``data`` and ``stringData`` (merged into ``data`` on write) and their decoded size together."""
    data, text = obj.get("data") or {}, obj.get("stringData") or {}
    errors = _key_errors("data", {**data, **text})
    size = sum(_decoded_size(v) for k, v in data.items() if k not in text) + \
        sum(len(str(v or "").encode()) for v in text.values())
    if size > MAX_DATA_BYTES:
        errors.append(("data", f"data: Too long: must have at most {MAX_DATA_BYTES} bytes"))
    return errors


def service_errors(obj: dict[str, Any]) -> Errors:
    """Ports: numbers in range, names unique and required once there is more than one port."""
    errors: Errors = []
    ports = (obj.get("spec") or {}).get("ports") or []
    names: set[str] = set()
    for i, port in enumerate(ports):
        number, name = port.get("port"), port.get("name") or ""
        if isinstance(number, int) and not 1 <= number <= 65535:
            field = f"spec.ports[{i}].port"
            errors.append((field, f"{field}: Invalid value: {number}: must be between 1 and 65535, inclusive"))
        field = f"spec.ports[{i}].name"
        if len(ports) > 1 and not name:
            errors.append((field, f"{field}: Required value"))
        elif name in names:
            errors.append((field, f"{field}: Duplicate value: {_q(name)}"))
        names.add(name)
    return errors


def lease_errors(obj: dict[str, Any]) -> Errors:
    spec = obj.get("spec") or {}
    errors: Errors = []
    duration, transitions = spec.get("leaseDurationSeconds"), spec.get("leaseTransitions")
    if isinstance(duration, int) and duration <= 0:
        errors.append(("spec.leaseDurationSeconds", f"spec.leaseDurationSeconds: Invalid value: {duration}: must be "
                                                    "greater than 0"))
    if isinstance(transitions, int) and transitions < 0:
        errors.append(("spec.leaseTransitions", f"spec.leaseTransitions: Invalid value: {transitions}: must be "
                                                "greater than or equal to 0"))
    return errors


RULES = {("", "configmaps"): config_map_errors, ("", "secrets"): secret_errors, ("", "services"): service_errors,
         ("coordination.k8s.io", "leases"): lease_errors}


def object_rules_errors(group: str, plural: str, obj: dict[str, Any]) -> Errors:
    rule = RULES.get((group, plural))
    return rule(obj) if rule else []
