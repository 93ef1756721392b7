"""``/openapi/v3``: the discovery index and one OpenAPI document per group-version, as kube-apiserver serves.

kubectl reads them before ``apply``/``create``: it checks that a kind's PATCH operation takes the
``fieldValidation`` query parameter (then it leaves validation to the server) and looks up the kind's schema
for building patches. A custom resource's schema is its CRD's ``openAPIV3Schema``, as on a real server.

Differs from a real API server: built-in kinds get an open object schema (``x-kubernetes-preserve-unknown-fields``)
instead of their full definitions, and there is no ``/openapi/v2``.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from .resource_types import ResourceType

PREFIX = "/openapi/v3"
_QUERY_PARAMETERS = ("dryRun", "fieldManager", "fieldValidation", "force", "pretty")


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def _schema_name(rt: ResourceType) -> str:
    """``dev.ascendtrain.v1alpha1.AscendTrainJob``, ``io.k8s.api.core.v1.Pod``: reversed group, as the server names them."""
    group = ".".join(reversed(rt.group.split("."))) if rt.group else "io.k8s.api.core"
    return f"{group}.{rt.version}.{rt.kind}"


def _gvk(rt: ResourceType) -> list[dict[str, str]]:
    return [{"group": rt.group, "version": rt.version, "kind": rt.kind}]


def _operation(rt: ResourceType, verb: str) -> dict[str, Any]:
    parameters = [{"name": name, "in": "query", "schema": {"type": "string"}} for name in _QUERY_PARAMETERS]
    ref = {"$ref": f"#/components/schemas/{_schema_name(rt)}"}
    return {"operationId": f"{verb}{rt.kind}", "parameters": parameters,
            "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": ref}}}},
            "x-kubernetes-action": verb, "x-kubernetes-group-version-kind": _gvk(rt)[0]}


def document(types: Iterable[ResourceType], group: str, version: str) -> dict[str, Any] | None:
    """The OpenAPI document of one group-version, or None when nothing is served there."""
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for rt in types:
        if (rt.group, rt.version) != (group, version):
            continue
        base = "/" + _gv_path(group, version) + ("/namespaces/{namespace}" if rt.namespaced else "")
        paths[f"{base}/{rt.plural}"] = {"get": _operation(rt, "list"), "post": _operation(rt, "post")}
        paths[f"{base}/{rt.plural}/{{name}}"] = {
            "get": _operation(rt, "get"), "put": _operation(rt, "put"), "patch": _operation(rt, "patch"),
            "delete": _operation(rt, "delete")}
        schema = dict(rt.schema.schema) if rt.schema is not None else {
            "type": "object", "x-kubernetes-preserve-unknown-fields": True}
        schemas[_schema_name(rt)] = {**schema, "x-kubernetes-group-version-kind": _gvk(rt)}
    if not paths:
        return None
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "local"}, "paths": paths,
            "components": {"schemas": schemas}}


def _digest(doc: dict[str, Any]) -> str:
    return hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:128].upper()


def serve(path: str, types: list[ResourceType]) -> dict[str, Any] | None:
    """The JSON for an ``/openapi/v3...`` path, or None for a path that does not exist."""
    rest = path[len(PREFIX):].strip("/")
    if not rest:
        index = {}
        for group, version in sorted({(rt.group, rt.version) for rt in types}):
            doc = document(types, group, version)
            if doc is not None:
                gv = _gv_path(group, version)
                index[gv] = {"serverRelativeURL": f"{PREFIX}/{gv}?hash={_digest(doc)}"}
        return {"paths": index}
    parts = rest.split("/")
    if parts[0] == "api" and len(parts) == 2:
        return document(types, "", parts[1])
    if parts[0] == "apis" and len(parts) == 3:
        return document(types, parts[1], parts[2])
    return None
