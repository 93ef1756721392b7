"""kube-apiserver's hand-written Pod spec rules (``ValidatePodSpec`` in pkg/apis/core/validation) for the fields a
job's pod template can carry, in its words: tolerations, container images, ports, resources, node selector and
service account here; env (``env_validation``), volumes and mounts (``volume_validation``), security contexts
(``security_context_validation``) and affinity (``affinity_validation``) in modules of their own. The OpenAPI
schema checks (types, required fields) are ``core_schemas``'; a quantity that does not parse fails decoding
(``quantity_error``).

Differs from a real API server: rules for fields the operator never sets (probes, lifecycle hooks, ephemeral
containers, topology spread, DNS config, ...) are not emulated.
"""
from __future__ import annotations

import re
from fractions import Fraction
from functools import lru_cache
from typing import Any

from .affinity_validation import affinity_errors
from .env_validation import env_errors
from .label_rules import (LABEL_VALUE, LABEL_VALUE_MESSAGE, label_errors, qualified_name_errors, quoted as _q,
                          unsupported)
from .object_names import format_errors
from .security_context_validation import container_context_errors, pod_context_errors
from .volume_validation import mount_errors, volume_errors

_TOLERATION_OPERATORS = ("Equal", "Exists")
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_PROTOCOLS = ("SCTP", "TCP", "UDP")
# resource.Quantity's parser (k8s.io/apimachinery/pkg/api/resource): the regular expression its error quotes, and
# the suffixes it knows.
_QUANTITY_MESSAGE = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|"
                       r"[eE][+-]?[0-9]+)?")
_SUFFIXES = {"": 1, "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "k": 10**3,
             "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
             **{s: 1024 ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))}}
_CONTAINER_RESOURCES = ("cpu", "memory", "ephemeral-storage")
_PORT_NAME = re.compile("^[-a-z0-9]+$")



def quantity(value: Any) -> Fraction | None:
    """A quantity's value, None when resource.Quantity cannot parse it (numbers are quantities too)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return Fraction(value)
    return _parsed_quantity(value) if isinstance(value, str) else None


@lru_cache(maxsize=4096)  # every pod of every job repeats its few quantities (Fractions are immutable)
def _parsed_quantity(value: str) -> Fraction | None:
    match = _QUANTITY.fullmatch(value)
    if match is None:
        return None
    number, suffix = Fraction(match.group(1)), match.group(2) or ""
    if suffix not in _SUFFIXES:  # an exponent (E alone is exa, Ei exbi)
        return number * Fraction(10) ** int(suffix[1:])
    return number * _SUFFIXES[suffix]


def _quantities(pod: dict[str, Any]) -> list[Any]:
    spec = pod.get("spec") or {}
    values = [v for c in spec.get("containers") or [] for part in ("requests", "limits")
              for v in ((c.get("resources") or {}).get(part) or {}).values()]
    values += [(v.get("emptyDir") or {}).get("sizeLimit") for v in spec.get("volumes") or []]
    return [v for v in values if v is not None]


def quantity_error(pod: dict[str, Any]) -> str | None:
    """Decoding's word on the pod's quantities (resources, emptyDir sizes): None when all parse."""
    return _QUANTITY_MESSAGE if any(quantity(v) is None for v in _quantities(pod)) else None


def _resource_errors(at: str, resources: dict[str, Any]) -> list[tuple[str, str]]:
    """Names, signs, requests <= limits, and extended resources' requests == limits (ValidateResourceRequirements)."""
    errors: list[tuple[str, str]] = []
    parsed: dict[str, dict[str, Fraction]] = {}
    for part in ("limits", "requests"):
        for name, value in (resources.get(part) or {}).items():
            here = f"{at}.resources.{part}[{name}]"
            named = qualified_name_errors(here, name)
            if named:
                errors += named
            elif "/" not in name and name not in _CONTAINER_RESOURCES and not name.startswith("hugepages-"):
                errors.append((here, f"{here}: Invalid value: {_q(name)}: must be a standard resource for "
                                     "containers"))
            amount = quantity(value)
            if amount is not None and amount < 0:
                errors.append((here, f"{here}: Invalid value: {_q(str(value))}: must be greater than or equal to 0"))
            elif amount is not None:
                parsed.setdefault(part, {})[name] = amount
    limits, requests = parsed.get("limits", {}), parsed.get("requests", {})
    for name, request in requests.items():
        shown = (resources.get("requests") or {})[name]
        field = f"{at}.resources.requests"
        extended = "/" in name and not name.startswith("kubernetes.io/")
        if extended and name in limits and request != limits[name]:
            errors.append((field, f"{field}: Invalid value: {_q(str(shown))}: must be equal to {name} limit of "
                                  f"{(resources.get('limits') or {})[name]}"))
        elif extended and name not in limits:
            errors.append((field, f"{field}: Forbidden: Limit must be set for non overcommitable resources"))
        elif name in limits and request > limits[name]:
            errors.append((field, f"{field}: Invalid value: {_q(str(shown))}: must be less than or equal to {name} "
                                  f"limit of {(resources.get('limits') or {})[name]}"))
    return errors


def _toleration_errors(spec: dict[str, Any]) -> list[tuple[str, str]]:
    errors: list[tuple[str, str]] = []
    for t, toleration in enumerate(spec.get("tolerations") or []):
        at = f"spec.tolerations[{t}]"
        key, operator = toleration.get("key") or "", toleration.get("operator") or ""
        value, effect = toleration.get("value") or "", toleration.get("effect") or ""
        if key:
            errors += qualified_name_errors(f"{at}.key", key)
        elif operator != "Exists":
            errors.append((f"{at}.operator", f'{at}.operator: Invalid value: {_q(operator)}: operator must be Exists '
                                             'when `key` is empty, which means "match all values and all keys"'))
        if toleration.get("tolerationSeconds") is not None and effect != "NoExecute":
            errors.append((f"{at}.effect", f"{at}.effect: Invalid value: {_q(effect)}: effect must be 'NoExecute' "
                                           "when `tolerationSeconds` is set"))
        if operator in ("", "Equal"):
            if not re.fullmatch(LABEL_VALUE, value) or len(value) > 63:
                errors.append((f"{at}.operator", f"{at}.operator: Invalid value: {_q(value)}: {LABEL_VALUE_MESSAGE}"))
        elif operator == "Exists":
            if value:
                errors.append((f"{at}.operator", f"{at}.operator: Invalid value: {_q(toleration)}: value must be "
                                                 "empty when `operator` is 'Exists'"))
        else:
            errors.append(unsupported(f"{at}.operator", operator, _TOLERATION_OPERATORS))
        if effect and effect not in _TAINT_EFFECTS:
            errors.append(unsupported(f"{at}.effect", effect, _TAINT_EFFECTS))
    return errors


def _container_errors(c: int, container: dict[str, Any], volumes: set[str]) -> list[tuple[str, str]]:
    at = f"spec.containers[{c}]"
    errors: list[tuple[str, str]] = []
    name = container.get("name") or ""
    if not name:
        errors.append((f"{at}.name", f"{at}.name: Required value"))
    else:
        errors += [(f"{at}.name", f"{at}.name: Invalid value: {_q(name)}: {m}")
                   for m in format_errors(name, "dns1123-label")]
    image = container.get("image")
    if not image:
        errors.append((f"{at}.image", f"{at}.image: Required value"))
    elif image != image.strip():
        errors.append((f"{at}.image", f"{at}.image: Invalid value: {_q(image)}: must not have leading or trailing "
                                      "whitespace"))
    port_names: set[str] = set()
    for p, port in enumerate(container.get("ports") or []):
        here = f"{at}.ports[{p}]"
        name = port.get("name")
        if name:
            if len(name) > 15 or not _PORT_NAME.match(name) or not re.search("[a-z]", name) or "--" in name \
                    or name.startswith("-") or name.endswith("-"):
                errors.append((f"{here}.name", f"{here}.name: Invalid value: {_q(name)}: must be no more than 15 "
                                               "characters, contain only lowercase alphanumeric characters or '-', "
                                               "contain at least one letter, and not start, end or contain '--'"))
            elif name in port_names:
                errors.append((f"{here}.name", f"{here}.name: Duplicate value: {_q(name)}"))
            port_names.add(name)
        for key in ("containerPort", "hostPort"):
            number = port.get(key)
            if key == "containerPort" and number is None:
                errors.append((f"{here}.{key}", f"{here}.{key}: Required value"))
            elif isinstance(number, int) and (number or key == "containerPort") and not 1 <= number <= 65535:
                errors.append((f"{here}.{key}", f"{here}.{key}: Invalid value: {number}: must be between 1 and "
                                                "65535, inclusive"))
        protocol = port.get("protocol", "TCP")
        if protocol not in _PROTOCOLS:
            errors.append(unsupported(f"{here}.protocol", protocol, _PROTOCOLS))
    errors += env_errors(at, container)
    errors += _resource_errors(at, container.get("resources") or {})
    errors += container_context_errors(f"{at}.securityContext", container.get("securityContext"))
    return errors + mount_errors(at, container, volumes)


def pod_spec_errors(pod: dict[str, Any]) -> list[tuple[str, str]]:
    spec = pod.get("spec") or {}
    errors, volumes = volume_errors(spec)
    names: set[str] = set()
    for c, container in enumerate(spec.get("containers") or []):
        errors += _container_errors(c, container, volumes)
        if container.get("name") in names:
            errors.append((f"spec.containers[{c}].name",
                           f"spec.containers[{c}].name: Duplicate value: {_q(container['name'])}"))
        names.add(container.get("name"))
    errors += label_errors("spec.nodeSelector", spec.get("nodeSelector"))
    account = spec.get("serviceAccountName")
    if account:
        errors += [("spec.serviceAccountName", f"spec.serviceAccountName: Invalid value: {_q(account)}: {m}")
                   for m in format_errors(account, "dns1123-subdomain")]
    errors += pod_context_errors(spec.get("securityContext"))
    errors += affinity_errors(spec)
    for i, volume in enumerate(spec.get("volumes") or []):
        size = quantity((volume.get("emptyDir") or {}).get("sizeLimit") or 0)
        if size is not None and size < 0:
            field = f"spec.volumes[{i}].emptyDir.sizeLimit"
            errors.append((field, f"{field}: Invalid value: {_q(volume['emptyDir']['sizeLimit'])}: must be greater "
                                  "than or equal to 0"))
    return errors + _toleration_errors(spec)
