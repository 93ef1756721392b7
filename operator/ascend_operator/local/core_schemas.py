"""Built-in objects (Pod, Service, ConfigMap, Event, Lease, ...) checked against Kubernetes' own OpenAPI schemas.

The schemas are the ones the PyPI package ``kubernetes-validate`` ships per Kubernetes version (JSON Schema
generated from each release's OpenAPI document); the server emulates ``KUBERNETES_VERSION`` and answers
``/version`` with it, so kubectl, the schemas and the reported version agree. Errors come back as kube-apiserver
words them: a value of the wrong JSON type fails decoding (400 BadRequest, ``cannot be handled as a Pod``), a
missing required field or an unsupported enum value fails validation (422 Invalid with the field path).

Unknown fields are dropped, with the request's ``fieldValidation`` deciding whether that is silent, a warning or
an error, as for custom objects.

Validity is decided first by ``jsonschema-rs`` (a compiled implementation of the same JSON Schema draft, held to
the same test suite) over the same schemas: a valid object, the common case, costs microseconds instead of the
milliseconds of a pure-Python walk, which was most of the emulated server's CPU while 500 jobs created their
pods. Only an object it finds invalid is walked by ``jsonschema`` for the errors and their paths, so every answer
is the one ``jsonschema`` gives.

Differs from a real API server: the decoding message names the JSON path and the schema's type instead of Go's
struct and type names; apimachinery's hand-written rules (names, tolerations, images, ports, volumes, env) are in
``pod_validation``, not here.
"""
from __future__ import annotations

import copy
import functools
import json
from typing import Any

import jsonschema
import jsonschema_rs
import referencing
from kubernetes_validate.utils import schema_contents

KUBERNETES_VERSION = "1.32.0"
# The strict variant: objects refuse unknown properties, which is how unknown fields are found (then pruned, or
# refused under fieldValidation=Strict, as kube-apiserver's decoder does).
_SCHEMA_DIR = f"kubernetes-json-schema/v{KUBERNETES_VERSION}-local-strict"


class DecodingError(ValueError):
    """A value of the wrong JSON type: kube-apiserver cannot decode the body (400 BadRequest)."""


def version_info() -> dict[str, str]:
    """``/version`` as a kube-apiserver of ``KUBERNETES_VERSION`` answers it."""
    major, minor, _ = KUBERNETES_VERSION.split(".")
    return {"major": major, "minor": minor, "gitVersion": f"v{KUBERNETES_VERSION}", "gitCommit": "",
            "gitTreeState": "clean", "buildDate": "", "goVersion": "", "compiler": "gc",
            "platform": "linux/amd64"}


_DEFINITIONS_URI = "https://kubernetes.io/api/_definitions.json"  # the $id the kinds' $refs resolve against


def _definitions() -> dict[str, Any]:
    return schema_contents(f"{_SCHEMA_DIR}/_definitions.json", KUBERNETES_VERSION)


@functools.cache
def _registry() -> referencing.Registry:
    return referencing.Resource.from_contents(_definitions()) @ referencing.Registry()


# The schema a custom object's metadata is decoded with: ObjectMeta, as for every kind (a CRD's own schema does not
# describe metadata), so an unknown field there is pruned or refused like one in a ConfigMap's metadata.
_OBJECT_META = ("", "", "ObjectMeta")


def _schema(group: str, version: str, kind: str) -> dict[str, Any] | None:
    if (group, version, kind) == _OBJECT_META:
        return {"$id": "https://kubernetes.io/api/objectmeta", "type": "object", "properties": {
            "metadata": {"$ref": "/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}}}
    api_version = f"{group.split('.', 1)[0]}-{version}" if group else version
    try:
        return schema_contents(f"{_SCHEMA_DIR}/{kind.lower()}-{api_version}.json", KUBERNETES_VERSION)
    except FileNotFoundError:
        return None


def kind_schema(group: str, version: str, kind: str) -> dict[str, Any] | None:
    """A built-in kind's OpenAPI schema (its ``x-kubernetes-patch-*`` extensions included), None for no such kind."""
    return _schema(group, version, kind)


def resolved(node: dict[str, Any] | None) -> dict[str, Any]:
    """``node`` with its ``$ref`` (or a single ``allOf``'s) followed into the shared definitions."""
    node = node or {}
    while True:
        if "$ref" in node:
            node = _definitions()["$defs"][node["$ref"].rsplit("/", 1)[1]]
        elif len(node.get("allOf") or []) == 1 and "properties" not in node:
            node = node["allOf"][0]
        else:
            return node


@functools.cache
def _validator(group: str, version: str, kind: str) -> jsonschema.Draft202012Validator | None:
    """The validator of one built-in kind, built once; None when Kubernetes has no such kind in this version."""
    schema = _schema(group, version, kind)
    return None if schema is None else jsonschema.Draft202012Validator(schema, registry=_registry())


@functools.cache
def _quick_validator(group: str, version: str, kind: str) -> jsonschema_rs.Draft202012Validator:
    """The compiled validator of a kind ``_validator`` has (formats are annotations in draft 2020-12, as there)."""
    registry = jsonschema_rs.Registry([(_DEFINITIONS_URI, _definitions())])
    return jsonschema_rs.Draft202012Validator(_schema(group, version, kind), registry=registry,
                                              validate_formats=False)


def _field(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return {dict: "object", list: "array", str: "string"}.get(type(value), "null")


class Checked:
    """The outcome of checking one built-in object: validation errors and the unknown fields found."""

    def __init__(self) -> None:
        self.errors: list[tuple[str, str]] = []
        self.unknown: list[list[str | int]] = []

    def unknown_fields(self) -> list[str]:
        return [_field(path) for path in self.unknown]

    def pruned(self, obj: dict[str, Any]) -> dict[str, Any]:
        """``obj`` without its unknown fields (a real server's decoder drops them)."""
        if not self.unknown:
            return obj
        obj = copy.deepcopy(obj)
        for path in self.unknown:
            holder: Any = obj
            for part in path[:-1]:
                holder = holder[part]
            holder.pop(path[-1], None)
        return obj


def check(group: str, version: str, kind: str, obj: dict[str, Any]) -> Checked:
    """Validation errors and unknown fields of a built-in object; raises DecodingError for a wrong JSON type."""
    return _check((group, version, kind), kind, version, obj)


def check_custom_metadata(kind: str, version: str, obj: dict[str, Any]) -> Checked:
    """The same for a custom object's ``metadata`` (paths start at ``metadata``, so ``pruned`` takes the object)."""
    return _check(_OBJECT_META, kind, version, {"metadata": obj.get("metadata") or {}})


def _check(schema: tuple[str, str, str], kind: str, version: str, obj: dict[str, Any]) -> Checked:
    checked = Checked()
    validator = _validator(*schema)
    if validator is None or _quick_validator(*schema).is_valid(obj):
        return checked
    for error in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
        path = list(error.absolute_path)
        field = _field(path)
        if error.validator == "additionalProperties":
            known = set((error.schema.get("properties") or {}))
            checked.unknown += [path + [key] for key in error.instance if key not in known]
        elif error.validator == "type":
            expected = error.validator_value
            expected = next(t for t in expected if t != "null") if isinstance(expected, list) else expected
            raise DecodingError(f'{kind} in version "{version}" cannot be handled as a {kind}: json: cannot '
                                f"unmarshal {_json_type(error.instance)} into Go struct field {field or kind} of "
                                f"type {expected}")
        elif error.validator == "required":
            missing = [r for r in error.validator_value if r not in (error.instance or {})]
            field = _field(path + missing[:1])
            checked.errors.append((field, f"{field}: Required value"))
        elif error.validator == "enum":
            allowed = ", ".join(json.dumps(v) for v in error.validator_value if v is not None)
            checked.errors.append((field, f"{field}: Unsupported value: {json.dumps(error.instance)}: supported "
                                          f"values: {allowed}"))
        else:
            checked.errors.append((field, f"{field}: Invalid value: {json.dumps(error.instance)}: {error.message}"))
    return checked
