"""kube-apiserver's hand-written Pod spec rules (``ValidatePodSpec`` in pkg/apis/core/validation) for the fields a
job's pod template can carry, in its words: tolerations, container images, ports, env and envFrom, resources,
security contexts' ids, node selector, service account, volumes and their mounts. The OpenAPI schema checks
(types, required fields) are ``core_schemas``'; a quantity that does not parse fails decoding (``quantity_error``).

Differs from a real API server: rules for fields the operator never sets (probes, lifecycle hooks, ephemeral
containers, topology spread, DNS config, ...) are not emulated.
"""
from __future__ import annotations

import json
import re
from fractions import Fraction
from typing import Any

from .object_names import DNS1123_LABEL, format_errors

_TOLERATION_OPERATORS = ("Equal", "Exists")
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_PROTOCOLS = ("SCTP", "TCP", "UDP")
_VOLUME_SOURCES = (
    "hostPath", "emptyDir", "gcePersistentDisk", "awsElasticBlockStore", "gitRepo", "secret", "nfs", "iscsi",
    "glusterfs", "persistentVolumeClaim", "rbd", "flexVolume", "cinder", "cephfs", "flocker", "downwardAPI", "fc",
    "azureFile", "configMap", "vsphereVolume", "quobyte", "azureDisk", "photonPersistentDisk", "projected",
    "portworxVolume", "scaleIO", "storageos", "csi", "ephemeral", "image")
_ENV_SOURCES = ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef")

_QUALIFIED_NAME = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_QUALIFIED_NAME_MESSAGE = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
                           "end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
                           f"used for validation is '{_QUALIFIED_NAME}')")
_LABEL_VALUE = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"
_LABEL_VALUE_MESSAGE = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
                        "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
                        f"'my_value',  or '12345', regex used for validation is '{_LABEL_VALUE}')")
# 1.32 has RelaxedEnvironmentVariableValidation on (beta): env names and envFrom prefixes are any printable ASCII
# but '='.
_ENV_NAME = "[ -<>-~]+"
_ENV_NAME_MESSAGE = "a valid environment variable name must consist only of printable ASCII characters other than '='"
# resource.Quantity's parser (k8s.io/apimachinery/pkg/api/resource): the regular expression its error quotes, and
# the suffixes it knows.
_QUANTITY_MESSAGE = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|"
                       r"[eE][+-]?[0-9]+)?")
_SUFFIXES = {"": 1, "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "k": 10**3,
             "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
             **{s: 1024 ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))}}
_CONTAINER_RESOURCES = ("cpu", "memory", "ephemeral-storage")
_ID_MAX = 2147483647
_PORT_NAME = re.compile("^[-a-z0-9]+$")


def _q(value: Any) -> str:
    return json.dumps(value)


def _supported(field: str, value: Any, allowed: tuple[str, ...]) -> tuple[str, str]:
    return field, f"{field}: Unsupported value: {_q(value)}: supported values: " + ", ".join(_q(a) for a in allowed)


def qualified_name_errors(field: str, key: str) -> list[tuple[str, str]]:
    """apimachinery's IsQualifiedName: an optional DNS-1123 subdomain prefix and a name part of 63 characters."""
    prefix, _, name = key.rpartition("/")
    out = []
    if "/" in key and (not prefix or format_errors(prefix, "dns1123-subdomain")):
        out.append((field, f"{field}: Invalid value: {_q(key)}: prefix part must be a lowercase RFC 1123 subdomain"))
    if not name or len(name) > 63 or not re.fullmatch(_QUALIFIED_NAME, name):
        out.append((field, f"{field}: Invalid value: {_q(key)}: {_QUALIFIED_NAME_MESSAGE}"))
    return out


def quantity(value: Any) -> Fraction | None:
    """A quantity's value, None when resource.Quantity cannot parse it (numbers are quantities too)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return Fraction(value)
    match = _QUANTITY.fullmatch(value) if isinstance(value, str) else None
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


def label_errors(field: str, labels: Any) -> list[tuple[str, str]]:
    """apimachinery's ValidateLabels: qualified-name keys, values of at most 63 characters in the label alphabet."""
    errors: list[tuple[str, str]] = []
    for key, value in (labels or {}).items():
        errors += qualified_name_errors(field, key)
        value = "" if value is None else str(value)
        if len(value) > 63:
            errors.append((field, f"{field}: Invalid value: {_q(value)}: must be no more than 63 characters"))
        if not re.fullmatch(_LABEL_VALUE, value):
            errors.append((field, f"{field}: Invalid value: {_q(value)}: {_LABEL_VALUE_MESSAGE}"))
    return errors


def _id_errors(field: str, context: dict[str, Any] | None, keys: tuple[str, ...]) -> list[tuple[str, str]]:
    errors = []
    for key in keys:
        ids = (context or {}).get(key)
        for number in ids if isinstance(ids, list) else [ids]:
            if isinstance(number, int) and not 0 <= number <= _ID_MAX:
                errors.append((f"{field}.{key}", f"{field}.{key}: Invalid value: {number}: must be between 0 and "
                                                 f"{_ID_MAX}, inclusive"))
    return errors


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
            if not re.fullmatch(_LABEL_VALUE, value) or len(value) > 63:
                errors.append((f"{at}.operator", f"{at}.operator: Invalid value: {_q(value)}: {_LABEL_VALUE_MESSAGE}"))
        elif operator == "Exists":
            if value:
                errors.append((f"{at}.operator", f"{at}.operator: Invalid value: {_q(toleration)}: value must be "
                                                 "empty when `operator` is 'Exists'"))
        else:
            errors.append(_supported(f"{at}.operator", operator, _TOLERATION_OPERATORS))
        if effect and effect not in _TAINT_EFFECTS:
            errors.append(_supported(f"{at}.effect", effect, _TAINT_EFFECTS))
    return errors


def _volume_errors(spec: dict[str, Any]) -> tuple[list[tuple[str, str]], set[str]]:
    errors: list[tuple[str, str]] = []
    seen: set[str] = set()
    for i, volume in enumerate(spec.get("volumes") or []):
        at, name = f"spec.volumes[{i}]", volume.get("name") or ""
        if not name:
            errors.append((f"{at}.name", f"{at}.name: Required value"))
        elif not re.fullmatch(DNS1123_LABEL, name) or len(name) > 63:
            errors += [(f"{at}.name", f"{at}.name: Invalid value: {_q(name)}: {m}")
                       for m in format_errors(name, "dns1123-label")]
        elif name in seen:
            errors.append((f"{at}.name", f"{at}.name: Duplicate value: {_q(name)}"))
        seen.add(name)
        sources = [s for s in _VOLUME_SOURCES if volume.get(s) is not None]
        if not sources:
            errors.append((at, f"{at}: Required value: must specify a volume type"))
        elif len(sources) > 1:
            errors.append((f"{at}.{sources[1]}", f"{at}.{sources[1]}: Forbidden: may not specify more than 1 "
                                                 "volume type"))
    return errors, seen


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
            errors.append(_supported(f"{here}.protocol", protocol, _PROTOCOLS))
    for e, env in enumerate(container.get("env") or []):
        here = f"{at}.env[{e}]"
        name = env.get("name") or ""
        if not name:
            errors.append((f"{here}.name", f"{here}.name: Required value"))
        elif not re.fullmatch(_ENV_NAME, name):
            errors.append((f"{here}.name", f"{here}.name: Invalid value: {_q(name)}: {_ENV_NAME_MESSAGE}"))
        source = env.get("valueFrom")
        if source is not None:
            given = [s for s in _ENV_SOURCES if source.get(s) is not None]
            if env.get("value"):
                errors.append((f"{here}.valueFrom", f'{here}.valueFrom: Invalid value: "": may not be specified '
                                                    "when `value` is not empty"))
            if not given:
                errors.append((f"{here}.valueFrom", f"{here}.valueFrom: Invalid value: \"\": must specify one of: "
                                                    "`fieldRef`, `resourceFieldRef`, `configMapKeyRef` or "
                                                    "`secretKeyRef`"))
            elif len(given) > 1:
                errors.append((f"{here}.valueFrom", f'{here}.valueFrom: Invalid value: "": may not have more than '
                                                    "one field specified at a time"))
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
    errors += _resource_errors(at, container.get("resources") or {})
    errors += _id_errors(f"{at}.securityContext", container.get("securityContext"), ("runAsUser", "runAsGroup"))
    paths: set[str] = set()
    for m, mount in enumerate(container.get("volumeMounts") or []):
        here = f"{at}.volumeMounts[{m}]"
        if mount.get("name") not in volumes:
            errors.append((f"{here}.name", f"{here}.name: Not found: {_q(mount.get('name'))}"))
        path = mount.get("mountPath") or ""
        if not path:
            errors.append((f"{here}.mountPath", f"{here}.mountPath: Required value"))
        elif path in paths:
            errors.append((f"{here}.mountPath", f"{here}.mountPath: Invalid value: {_q(path)}: must be unique"))
        paths.add(path)
    return errors


def pod_spec_errors(pod: dict[str, Any]) -> list[tuple[str, str]]:
    spec = pod.get("spec") or {}
    errors, volumes = _volume_errors(spec)
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
    errors += _id_errors("spec.securityContext", spec.get("securityContext"),
                         ("runAsUser", "runAsGroup", "fsGroup", "supplementalGroups"))
    for i, volume in enumerate(spec.get("volumes") or []):
        size = quantity((volume.get("emptyDir") or {}).get("sizeLimit") or 0)
        if size is not None and size < 0:
            field = f"spec.volumes[{i}].emptyDir.sizeLimit"
            errors.append((field, f"{field}: Invalid value: {_q(volume['emptyDir']['sizeLimit'])}: must be greater "
                                  "than or equal to 0"))
    return errors + _toleration_errors(spec)
