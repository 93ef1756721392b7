"""A Kubernetes API server on loopback: kmock's ``KubernetesEmulator`` extended toward the real one.

kmock gives the aiohttp plumbing, error rendering and discovery (``/api``, ``/apis``, ``/apis/<g>/<v>``).
``LocalKubernetesApi`` replaces its object handling with the parts of the real API server that operators and
tools rely on: object metadata (uid, resourceVersion, generation, generateName, timestamps), PUT and PATCH
(merge, strategic merge, JSON patch), the ``/status`` subresource, label and field selectors,
watches that resume from a resourceVersion, finalizers, owner-reference garbage collection, CRDs that register
their resources at once, and custom objects pruned, defaulted and validated (OpenAPI schema and CEL rules).

Comments marked "Differs from a real API server" say where it stays simpler.
"""
from __future__ import annotations

import asyncio
import base64
import bisect
import copy
import datetime
import json
import logging
import random
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Any

import aiohttp.web
import attrs
import orjson
import yaml
from kmock import KubernetesEmulator
from kmock._internal.k8s import KubernetesResourceNotFoundError

from . import admission_plugins, authorization, field_validation
from . import core_schemas, dry_run, list_pages, openapi, persistence, protobuf_codec, tables
from .crd_schema import CustomResourceSchema
from .object_names import object_errors
from .object_selectors import SelectorError, field_selector, label_selector
from . import server_side_apply, strategic_merge_patch
from .patches import PatchError, json_patch, merge_patch
from .object_meta import metadata_errors
from .core_object_rules import object_rules_errors
from .pod_validation import pod_spec_errors, quantity_error
from .pod_logs import serve_log
from .resource_types import BUILTIN_TYPES, INITIAL_NAMESPACES, VERBS, ResourceType

logger = logging.getLogger(__name__)

ObjectKey = tuple[tuple[str, str, str], str | None, str]  # (type key, namespace, name)
# kube-apiserver's MaxRequestBodyBytes: a larger body is answered 413 before it is decoded (aiohttp's own default,
# 1 MiB, would refuse a ConfigMap that kube-apiserver takes, and as a 500).
MAX_REQUEST_BODY_BYTES = 3 * 1024 * 1024
NAMESPACES, SERVICE_ACCOUNTS = ("", "v1", "namespaces"), ("", "v1", "serviceaccounts")
PRIORITY_CLASSES = ("scheduling.k8s.io", "v1", "priorityclasses")
ADMIN_TOKEN = "local"  # the kubeconfig's token: system:masters, as a cluster's admin credentials are
_NO_STRATEGIC_MERGE = ("the body of the request was in an unknown format - accepted media types include: "
                       "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml")
EVENT_LOG_LIMIT = 50_000  # watch events kept for resuming; older resourceVersions answer 410 Gone
ENCODED_EVENTS_KEPT = 4096  # watch events' JSON lines kept for the other watchers of the same change


def _json_bytes(value: Any) -> bytes:
    """Compact JSON, as kube-apiserver writes it (orjson: a tenth of the CPU of Python's encoder, which still
    writes what orjson refuses, such as integers past 64 bits)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":")).encode()


def _go_number(text: str) -> int | float:
    """A JSON integer as kube-apiserver decodes it: an int64, or a float64 beyond that range (which then fails an
    integer schema's type check instead of being stored as written)."""
    value = int(text)
    return value if -2 ** 63 <= value < 2 ** 63 else float(value)


def _json_answer(value: Any, status: int = 200) -> aiohttp.web.Response:
    return aiohttp.web.Response(body=_json_bytes(value), status=status, content_type="application/json")


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    """An error answered as a Kubernetes ``Status`` object."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "details": self.details, "code": self.code}

    def response(self) -> aiohttp.web.Response:
        return _json_answer(self.status(), status=self.code)


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.qualified_plural} "{name}" not found',
                    {"name": name, "group": rt.group, "kind": rt.plural})


# A field error's words -> its StatusCause reason (apimachinery's field.ErrorType).
_CAUSE_REASONS = (("Unsupported value", "FieldValueNotSupported"), ("Required value", "FieldValueRequired"),
                  ("Forbidden", "FieldValueForbidden"), ("Duplicate value", "FieldValueDuplicate"),
                  ("Not found", "FieldValueNotFound"), ("Too long", "FieldValueTooLong"),
                  ("Too many", "FieldValueTooMany"))


def _cause(field: str, message: str) -> dict[str, str]:
    """A StatusCause as kube-apiserver writes it: the field path in ``field``, the message without it (kubectl
    prints ``field: message``, so a path inside the message would show twice)."""
    body = message[len(field) + 2:] if message.startswith(f"{field}: ") else message
    reason = next((r for words, r in _CAUSE_REASONS if body.startswith(words)), "FieldValueInvalid")
    return {"reason": reason, "message": body, "field": field}


def invalid(rt: ResourceType, name: str, errors: list[tuple[str, str]]) -> ApiError:
    messages = [m for _, m in errors]
    text = messages[0] if len(messages) == 1 else "[" + ", ".join(messages) + "]"
    causes = [_cause(f, m) for f, m in errors]
    return ApiError(422, "Invalid", f'{rt.qualified_kind} "{name}" is invalid: {text}',
                    {"name": name, "group": rt.group, "kind": rt.kind, "causes": causes})


@dataclass(frozen=True)
class Target:
    """A parsed resource URL: ``/api/v1/namespaces/ns/pods/name/status``."""

    group: str
    version: str
    plural: str
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


def parse_target(path: str) -> Target | None:
    """The resource a URL addresses, or None for discovery and other non-resource paths."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces" and not (len(rest) == 3 and rest[2] in ("status", "finalize")):
        namespace, rest = rest[1], rest[2:]
    if not rest:
        return None
    return Target(group, version, rest[0], namespace, rest[1] if len(rest) > 1 else None,
                  "/".join(rest[2:]) or None)


def _spec_part(obj: dict[str, Any]) -> dict[str, Any]:
    """What ``metadata.generation`` tracks: everything but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


@attrs.define(kw_only=True)
class LocalKubernetesApi(KubernetesEmulator):
    """The object store and request handling; one instance per cluster, used from one event loop.

    All mutations are synchronous functions run in the event loop's thread, so each request's change is
    atomic without locks; only response writing awaits.
    """

    _types: dict[tuple[str, str, str], ResourceType] = attrs.field(factory=dict, init=False)
    _store: dict[ObjectKey, dict[str, Any]] = attrs.field(factory=dict, init=False)
    _uids: dict[str, ObjectKey] = attrs.field(factory=dict, init=False)
    _rv: int = attrs.field(default=0, init=False)
    _log: list[tuple[int, tuple[str, str, str], str, dict[str, Any], dict[str, Any] | None]] = attrs.field(
        factory=list, init=False)
    _log_floor: int = attrs.field(default=0, init=False)
    _encoded: dict[tuple[int, str], bytes] = attrs.field(factory=dict, init=False)
    # Per resource type, what its watchers wait on: a change wakes only the watchers of its type.
    _wakes: dict[tuple[str, str, str], asyncio.Event] = attrs.field(factory=dict, init=False)
    _closing: bool = attrs.field(default=False, init=False)
    tokens: authorization.Tokens = attrs.field(factory=lambda: authorization.Tokens(ADMIN_TOKEN), init=False)
    _rbac: dict[tuple[str, str | None], list[dict[str, Any]]] | None = attrs.field(default=None, init=False)
    _classes: list[dict[str, Any]] | None = attrs.field(default=None, init=False)  # PriorityClasses, until one changes
    # Where the node keeps a pod's container log (the kubelet's side of pods/log); None: no node serves logs.
    pod_log_file: Callable[[str, str], Path] | None = attrs.field(default=None)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for rt in BUILTIN_TYPES:
            self._register(rt)
        for name in INITIAL_NAMESPACES:
            self._create(self._types[NAMESPACES], None, {"metadata": {"name": name}})
        for priority_class in admission_plugins.system_priority_classes():
            self._create(self._types[PRIORITY_CLASSES], None, priority_class)

    def make_default_service_accounts(self) -> None:
        """The service-account controller's work: every namespace has its ``default`` account (a new namespace
        gets it as it is created; this catches up after a restore of objects saved without it)."""
        for _, _, namespace in [key for key in self._store if key[0] == NAMESPACES]:
            self._make_default_service_account(namespace)

    def _make_default_service_account(self, namespace: str) -> None:
        if (SERVICE_ACCOUNTS, namespace, admission_plugins.DEFAULT_SERVICE_ACCOUNT) not in self._store:
            self._create(self._types[SERVICE_ACCOUNTS], namespace, admission_plugins.default_service_account(namespace))

    # -- discovery -------------------------------------------------------------------------------

    def _register(self, rt: ResourceType) -> None:
        self._types[rt.key] = rt
        ref, info = rt.discovery()
        self.resources[ref] = info

    def _unregister(self, rt: ResourceType) -> None:
        self._types.pop(rt.key, None)
        ref, _ = rt.discovery()
        del self.resources[ref]

    def _get_resources(self) -> list[Any]:
        return [rt.discovery()[0] for rt in self._types.values()]

    async def _serve_version(self, request: Any) -> dict[str, Any]:
        """``/api/v1`` and ``/apis/<g>/<v>``: an APIResourceList with subresources listed as a real server does."""
        group, version = request.resource.group, request.resource.version
        entries = []
        for rt in self._types.values():
            if (rt.group, rt.version) != (group, version):
                continue
            entries.append({"name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced,
                            "kind": rt.kind, "verbs": sorted(VERBS), "shortNames": list(rt.short_names),
                            "categories": list(rt.categories)})
            if rt.key == ("", "v1", "pods"):  # kubectl drain looks here for the Eviction API
                entries.append({"name": "pods/eviction", "singularName": "", "namespaced": True, "group": "policy",
                                "version": "v1", "kind": "Eviction", "verbs": ["create"]})
            if rt.status_subresource:
                entries.append({"name": f"{rt.plural}/status", "singularName": "", "namespaced": rt.namespaced,
                                "kind": rt.kind, "verbs": ["get", "patch", "update"]})
        if not entries and group:
            raise KubernetesResourceNotFoundError()
        return {"apiVersion": "v1", "kind": "APIResourceList", "groupVersion": f"{group}/{version}".lstrip("/"),
                "resources": entries}

    async def _serve_server_version(self, request: Any) -> dict[str, Any]:
        """``/version``: the Kubernetes release whose schemas the built-in kinds are validated against."""
        return core_schemas.version_info()

    # -- HTTP entry point ------------------------------------------------------------------------

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        target = parse_target(raw.path)
        if (refused := self._authorize(raw, target)) is not None:
            return refused.response()
        if raw.path.startswith(openapi.PREFIX) and raw.method.upper() == "GET":
            doc = openapi.serve(raw.path, list(self._types.values()))
            if doc is None:
                return ApiError(404, "NotFound", "the server could not find the requested resource").response()
            return _json_answer(doc)
        if target is None:  # discovery and /version: kmock serves them
            if len(raw.path) > 1 and raw.path.endswith("/"):
                raw = raw.clone(rel_url=raw.rel_url.with_path(raw.path.rstrip("/")))
            return await super().__call__(raw)
        if protobuf_codec.only_protobuf(raw.headers.get("Accept", "")) and target.subresource != "log":
            if raw.query.get("watch") in ("true", "1"):
                # Differs from a real API server: no protobuf watch stream (length-prefixed WatchEvents).
                return ApiError(406, "NotAcceptable", "only the following media types are accepted: "
                                                      "application/json, application/json;stream=watch").response()
            return self._as_protobuf(await self._serve(raw, target))
        return await self._serve(raw, target)

    def _authorize(self, raw: aiohttp.web.BaseRequest, target: Target | None) -> ApiError | None:
        """401 for a token nobody issued, 403 where RBAC says no (see ``authorization``); None: go on."""
        user = self.tokens.user(raw.headers.get("Authorization"))
        if user is None:
            return ApiError(401, "Unauthorized", "Unauthorized")
        if user.master:
            return None
        if target is None:  # discovery, /version, /openapi: system:discovery and system:public-info-viewer
            return None
        resource = target.plural + (f"/{target.subresource}" if target.subresource else "")
        verb = authorization.verb(raw.method, target.name, raw.query.get("watch") in ("true", "1"))
        if raw.method.upper() == "PATCH" and raw.content_type == "application/apply-patch+yaml":
            verb = "patch"
        if authorization.allowed(user, verb, target.group, resource, target.namespace, target.name,
                                 self._rbac_objects):
            return None
        return ApiError(403, "Forbidden", authorization.forbidden_message(
            user, verb, target.group, resource, target.namespace, target.name),
            {"name": target.name or "", "group": target.group, "kind": target.plural})

    def _rbac_objects(self, plural: str, namespace: str | None) -> list[dict[str, Any]]:
        """The stored Roles, ClusterRoles and bindings, indexed once per change of any of them."""
        if self._rbac is None:
            self._rbac = {}
            for (type_key, ns, _), obj in self._store.items():
                if type_key[0] == authorization.RBAC_GROUP:
                    self._rbac.setdefault((type_key[2], None), []).append(obj)
                    self._rbac.setdefault((type_key[2], ns), []).append(obj)
        return self._rbac.get((plural, namespace), [])

    @staticmethod
    def _as_protobuf(response: aiohttp.web.StreamResponse) -> aiohttp.web.StreamResponse:
        """A JSON answer re-encoded for a client that accepts only protobuf; 406 where kube-apiserver has no
        protobuf form either (custom resources, watches, tables)."""
        body = json.loads(response.body) if isinstance(response, aiohttp.web.Response) and response.body else None
        if not isinstance(body, dict) or not protobuf_codec.encodable(body.get("apiVersion", ""),
                                                                        body.get("kind", "")):
            return ApiError(406, "NotAcceptable", "only the following media types are accepted: application/json, "
                                                  "application/yaml").response()
        encoded = aiohttp.web.Response(body=protobuf_codec.encode(body), status=response.status,
                                       content_type=protobuf_codec.MEDIA_TYPE)
        for warning in response.headers.getall("Warning", []):
            encoded.headers.add("Warning", warning)
        return encoded

    async def _serve(self, raw: aiohttp.web.BaseRequest, target: Target) -> aiohttp.web.StreamResponse:
        try:
            fields = field_validation.begin(raw.query if raw.method in ("POST", "PUT", "PATCH") else {})
            if "dryRun" in raw.query and raw.method.upper() in ("POST", "PUT", "PATCH", "DELETE"):
                if error := dry_run.check(raw.query.getall("dryRun")):
                    raise ApiError(400, "BadRequest", error)
                await raw.read()  # cached: the write below then runs without yielding to other requests
                with dry_run.rolled_back(self):
                    response = await self._dispatch(raw, target)
            else:
                response = await self._dispatch(raw, target)
            for warning in fields.warnings:
                response.headers.add("Warning", warning)
            return response
        except ApiError as exc:
            return exc.response()
        except aiohttp.web.HTTPRequestEntityTooLarge:
            return ApiError(413, "RequestEntityTooLarge",
                            f"Request entity too large: limit is {MAX_REQUEST_BODY_BYTES}").response()
        except (SelectorError, PatchError, field_validation.FieldValidationError) as exc:
            return ApiError(400, "BadRequest", str(exc)).response()
        except Exception as exc:  # a bug here must reach the client as a 500, not a dropped connection
            logger.exception("internal error serving %s %s", raw.method, raw.path)
            return ApiError(500, "InternalError", f"{type(exc).__name__}: {exc}").response()

    def _type(self, target: Target) -> ResourceType:
        rt = self._types.get((target.group, target.version, target.plural))
        if rt is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource",
                           {"group": target.group, "kind": target.plural})
        if target.namespace is not None and not rt.namespaced:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return rt

    @staticmethod
    async def _body(raw: aiohttp.web.BaseRequest, rt: ResourceType | None = None) -> Any:
        if raw.content_type == protobuf_codec.MEDIA_TYPE:
            if rt is None or rt.crd_name is not None:  # custom resources have no protobuf form
                raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                                                            "accepted media types include: application/json, "
                                                            "application/yaml")
            try:
                return protobuf_codec.decode(await raw.read())
            except protobuf_codec.ProtobufError as exc:
                raise ApiError(400, "BadRequest", str(exc)) from None
        text = await raw.text()
        if not text.strip():
            return None
        try:
            return json.loads(text, parse_int=_go_number)
        except ValueError:
            try:
                return yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise ApiError(400, "BadRequest", f"the request body is neither JSON nor YAML: {exc}") from None

    async def _delete_options(self, raw: aiohttp.web.BaseRequest, rt: ResourceType) -> dict[str, Any]:
        """DeleteOptions from the body, with the query parameters clients may send instead."""
        options = dict(await self._body(raw, rt) or {})
        options.pop("apiVersion", None), options.pop("kind", None)
        if "gracePeriodSeconds" in raw.query:
            options["gracePeriodSeconds"] = int(raw.query["gracePeriodSeconds"])
        if "propagationPolicy" in raw.query:
            options["propagationPolicy"] = raw.query["propagationPolicy"]
        return options

    async def _dispatch(self, raw: aiohttp.web.BaseRequest, target: Target) -> aiohttp.web.StreamResponse:
        rt, method, query = self._type(target), raw.method.upper(), raw.query
        ns = target.namespace
        watching = method == "GET" and query.get("watch") in ("true", "1")
        if target.name is None:
            if watching:
                return await self._watch(raw, rt, ns, query)
            if method == "GET":
                listed = self._list(rt, ns, query)
                if tables.wants_table(raw.headers.get("Accept", "")):
                    table = tables.table(rt, listed["items"], listed["metadata"]["resourceVersion"],
                                         query.get("includeObject", ""))
                    table["metadata"] = listed["metadata"]  # with continue: kubectl's --chunk-size pages
                    return _json_answer(table)
                return _json_answer(listed)
            if method == "POST":
                return _json_answer(self._create(rt, ns, await self._body(raw, rt)), status=201)
            if method == "DELETE":
                options = await self._delete_options(raw, rt)
                return _json_answer(self._delete_collection(rt, ns, query, options))
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on a collection")
        if rt.namespaced and ns is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        key = (rt.key, ns, target.name)
        sub = target.subresource
        if sub == "binding" and rt.plural == "pods" and method == "POST":
            return _json_answer(self._bind(rt, key, await self._body(raw, rt)), status=201)
        if sub == "eviction" and rt.plural == "pods" and not rt.group and method == "POST":
            return _json_answer(self._evict(rt, key, await self._body(raw, rt)), status=201)
        if sub == "log" and rt.plural == "pods" and not rt.group and method == "GET":
            return await self._pod_log(raw, rt, key)
        if sub not in (None, "status") or (sub == "status" and not rt.status_subresource):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if watching:
            query = {**query, "fieldSelector": f"metadata.name={target.name}"}
            return await self._watch(raw, rt, ns, query)
        if method == "GET":
            if tables.wants_table(raw.headers.get("Accept", "")):
                obj = self._get(rt, key)
                return _json_answer(tables.table(rt, [obj], obj["metadata"].get("resourceVersion", ""),
                                                              query.get("includeObject", "")))
            return _json_answer(self._get(rt, key))
        if method == "PUT":
            return _json_answer(self._replace(rt, key, await self._body(raw, rt), sub))
        if method == "PATCH":
            body = await self._body(raw)  # patches are JSON or YAML, whatever the kind
            if raw.content_type == "application/apply-patch+yaml":
                return _json_answer(self._server_side_apply(rt, key, body, query, sub))
            return _json_answer(self._patch(rt, key, body, raw.content_type, sub))
        if method == "DELETE":
            return _json_answer(self._delete(rt, key, await self._delete_options(raw, rt)))
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {rt.plural}")

    async def _pod_log(self, raw: aiohttp.web.BaseRequest, rt: ResourceType,
                       key: ObjectKey) -> aiohttp.web.StreamResponse:
        pod = self._get(rt, key)
        if self.pod_log_file is None or not (pod.get("spec") or {}).get("nodeName"):
            raise ApiError(400, "BadRequest", f'pod {key[2]} does not have a host assigned')
        try:
            return await serve_log(raw, pod, self.pod_log_file(key[1] or "", key[2]), lambda: self._store.get(key))
        except (LookupError, FileNotFoundError) as exc:
            raise ApiError(400, "BadRequest", str(exc).strip('"')) from None

    # -- reads -----------------------------------------------------------------------------------

    def _get(self, rt: ResourceType, key: ObjectKey) -> dict[str, Any]:
        obj = self._store.get(key)
        if obj is None:
            raise not_found(rt, key[2])
        return obj

    def _matcher(self, query: Any) -> Any:
        by_label = label_selector(query.get("labelSelector"))
        by_field = field_selector(query.get("fieldSelector"))
        return lambda obj: by_label(obj) and by_field(obj)

    def _list(self, rt: ResourceType, ns: str | None, query: Any) -> dict[str, Any]:
        """A list, one page of ``limit`` items when asked (``list_pages``: snapshot pages, kube's tokens)."""
        try:
            limit = int(query.get("limit") or 0)
        except ValueError:
            raise ApiError(400, "BadRequest", f'limit: Invalid value: "{query.get("limit")}"') from None
        rv, start = self._rv, ""
        if query.get("continue"):
            if query.get("resourceVersion"):
                raise ApiError(400, "BadRequest", "specifying resource version is not allowed when using continue")
            try:
                rv, start = list_pages.decode(query["continue"])
            except list_pages.ContinueError as exc:
                raise ApiError(400, "BadRequest", str(exc)) from None
            if rv < self._log_floor or rv > self._rv:
                raise ApiError(410, "Expired", list_pages.TOO_OLD)
        current = [obj for (tk, ons, _), obj in self._store.items() if tk == rt.key and (ns is None or ons == ns)]
        newer = [(kind, obj, old) for erv, tk, kind, obj, old in
                 self._log[bisect.bisect_right(self._log, rv, key=lambda e: e[0]):]
                 if tk == rt.key and (ns is None or obj["metadata"].get("namespace") == ns)] if rv < self._rv else []
        selected = bool(query.get("labelSelector") or query.get("fieldSelector"))
        items, meta = list_pages.page(list_pages.snapshot(current, newer), self._matcher(query), max(limit, 0),
                                      start, rv, selected)
        return {"apiVersion": rt.api_version, "kind": f"{rt.kind}List", "metadata": meta, "items": items}

    # -- writes ----------------------------------------------------------------------------------

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _emit(self, rt: ResourceType, kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if rt.group == authorization.RBAC_GROUP:
            self._rbac = None
        if rt.key == PRIORITY_CLASSES:
            self._classes = None
        self._log.append((self._rv, rt.key, kind, obj, old))
        if len(self._log) > EVENT_LOG_LIMIT:
            drop = len(self._log) // 2
            self._log_floor = self._log[drop - 1][0]
            del self._log[:drop]
        wake = self._wakes.pop(rt.key, None)
        if wake is not None:
            wake.set()

    def _check_kind(self, rt: ResourceType, body: Any) -> dict[str, Any]:
        """``body`` as an object of ``rt``; the body is the caller's to give (parsed for this request): it is
        changed in place, not copied (stored objects are never changed in place, so they share no state)."""
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", f"the body must be a {rt.kind} object")
        obj = body
        if obj.get("kind", rt.kind) != rt.kind or obj.get("apiVersion", rt.api_version) != rt.api_version:
            raise ApiError(400, "BadRequest", f"the body is a {obj.get('apiVersion')}/{obj.get('kind')}, "
                                              f"expected {rt.api_version}/{rt.kind}")
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        if not isinstance(obj.setdefault("metadata", {}), dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")
        return obj

    def _create(self, rt: ResourceType, ns: str | None, body: Any) -> dict[str, Any]:
        obj = self._check_kind(rt, body)
        meta = obj["metadata"]
        if rt.namespaced:
            if ns and meta.get("namespace") not in (None, ns):
                raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the "
                                                  "namespace sent on the request")
            # Differs from a real API server: a namespaced POST without a namespace in the URL lands in the
            # object's namespace (or "default") instead of answering 404.
            ns = ns or meta.get("namespace") or "default"
            if (("", "v1", "namespaces"), None, ns) not in self._store:
                raise ApiError(404, "NotFound", f'namespaces "{ns}" not found',
                               {"name": ns, "kind": "namespaces"})
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise invalid(rt, "", [("metadata.name", "metadata.name: Required value: name or "
                                                          "generateName is required")])
            alphabet = "bcdfghjklmnpqrstvwxz2456789"
            meta["name"] = meta["generateName"] + "".join(random.choice(alphabet) for _ in range(5))
        key = (rt.key, ns if rt.namespaced else None, meta["name"])
        if key in self._store:
            raise ApiError(409, "AlreadyExists", f'{rt.qualified_plural} "{meta["name"]}" already exists',
                           {"name": meta["name"], "group": rt.group, "kind": rt.plural})
        for field in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
            meta.pop(field, None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
        if rt.status_subresource:
            # Create ignores a status, as the real server does; a new pod starts Pending and a namespace Active.
            obj.pop("status", None)
            if rt.plural == "pods":
                obj["status"] = {"phase": "Pending"}
            if rt.plural == "namespaces":
                obj["status"] = {"phase": "Active"}
        obj = self._admit(rt, obj, None)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self._store[key] = obj
        self._uids[meta["uid"]] = key
        if rt.plural == "customresourcedefinitions":
            self._register_crd(obj, replacing=None)
        self._emit(rt, "ADDED", obj, None)
        if rt.key == NAMESPACES:
            self._make_default_service_account(meta["name"])
        return obj

    def _admit(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        """Per-kind rules applied on every write: schema for custom objects, CRD registration, Secret data."""
        name = obj["metadata"].get("name", "")
        errors = object_errors(rt.group, rt.plural, obj) if old is None else []  # names are immutable
        if rt.schema is None and rt.crd_name is None:  # a built-in kind: Kubernetes' own OpenAPI schema
            try:
                checked = core_schemas.check(rt.group, rt.version, rt.kind, obj)
            except core_schemas.DecodingError as exc:
                raise ApiError(400, "BadRequest", str(exc)) from None
            field_validation.report(rt.kind, rt.version, checked.unknown_fields())  # decoding comes first
            obj = checked.pruned(obj)
            errors += checked.errors
        pruned: list[str] = []
        if rt.schema is not None:  # a custom object's metadata is decoded as ObjectMeta, as any kind's is
            try:
                meta = core_schemas.check_custom_metadata(rt.kind, rt.version, obj)
            except core_schemas.DecodingError as exc:
                raise ApiError(400, "BadRequest", str(exc)) from None
            pruned, obj = meta.unknown_fields(), meta.pruned(obj)
        errors += metadata_errors(obj)
        if rt.schema is None and rt.crd_name is None:
            errors += object_rules_errors(rt.group, rt.plural, obj)
        if rt.plural == "pods" and not rt.group and old is None:  # a pod's spec is (nearly) immutable
            if problem := quantity_error(obj):
                raise ApiError(400, "BadRequest", f'Pod in version "v1" cannot be handled as a Pod: {problem}')
            if reason := admission_plugins.admit_pod(obj, self._service_account, self._priority_classes):
                raise ApiError(403, "Forbidden", f'pods "{name}" is forbidden: {reason}',
                               {"name": name, "kind": "pods"})
            errors += pod_spec_errors(obj)
        if rt.schema is not None:
            obj = rt.schema.prepare(obj, pruned, old)
            field_validation.report(rt.kind, rt.version, pruned)  # decoding comes before validation
            errors += rt.schema.errors(obj, old)
        if errors:
            raise invalid(rt, name, errors)
        if rt.plural == "secrets" and not rt.group and "stringData" in obj:
            data = obj.setdefault("data", {})
            for k, v in (obj.pop("stringData") or {}).items():
                data[k] = base64.b64encode(str(v).encode()).decode()
        if rt.plural == "customresourcedefinitions":
            obj = self._admit_crd(obj)
        return obj

    def _service_account(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._store.get((SERVICE_ACCOUNTS, namespace, name))

    def _priority_classes(self) -> list[dict[str, Any]]:
        if self._classes is None:
            self._classes = [obj for key, obj in self._store.items() if key[0] == PRIORITY_CLASSES]
        return self._classes

    def _replace(self, rt: ResourceType, key: ObjectKey, body: Any, sub: str | None) -> dict[str, Any]:
        current = self._get(rt, key)
        new = self._check_kind(rt, body)
        if new["metadata"].get("name") not in (None, key[2]):
            raise ApiError(400, "BadRequest", f'the name of the object ({new["metadata"]["name"]}) does not '
                                              f"match the name on the URL ({key[2]})")
        # Differs from a real API server: a PUT without metadata.resourceVersion is accepted as unconditional
        # for every kind (the real one requires it for custom resources).
        self._check_precondition(rt, current, new["metadata"].get("resourceVersion"))
        return self._update(rt, key, current, new, sub)

    def _patch(self, rt: ResourceType, key: ObjectKey, body: Any, content_type: str,
               sub: str | None) -> dict[str, Any]:
        current = self._get(rt, key)
        if content_type == "application/json-patch+json":
            new = json_patch(current, body)
        elif content_type == "application/strategic-merge-patch+json":
            if rt.schema is not None or rt.crd_name is not None:  # custom resources have no patch strategies
                raise ApiError(415, "UnsupportedMediaType", _NO_STRATEGIC_MERGE)
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "a strategic merge patch must be a JSON object")
            self._check_precondition(rt, current, (body.get("metadata") or {}).get("resourceVersion"))
            new = strategic_merge_patch.apply(current, body, core_schemas.kind_schema(rt.group, rt.version, rt.kind))
        elif content_type in ("application/merge-patch+json", "application/json"):
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
            self._check_precondition(rt, current, (body.get("metadata") or {}).get("resourceVersion"))
            new = merge_patch(current, body)
        else:
            raise ApiError(415, "UnsupportedMediaType", f"the patch type {content_type!r} is not supported")
        return self._update(rt, key, current, new, sub)

    def _server_side_apply(self, rt: ResourceType, key: ObjectKey, body: Any, query: Any,
                           sub: str | None) -> dict[str, Any]:
        """``kubectl apply --server-side``: creates the object when it does not exist (see server_side_apply)."""
        manager = query.get("fieldManager")
        if not manager:
            raise ApiError(400, "BadRequest", "PATCH, application/apply-patch+yaml requires fieldManager to be set")
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "an apply patch must be an object")
        self._check_kind(rt, copy.deepcopy(body))
        current = self._store.get(key)
        if current is None and sub is not None:
            raise not_found(rt, key[2])
        try:
            new = server_side_apply.apply(current, body, manager, query.get("force") == "true", rt.api_version)
        except server_side_apply.ApplyConflict as exc:
            causes = [{"reason": "FieldManagerConflict", "message": f'conflict with "{m}"',
                       "field": "." + ".".join(p)} for m, p in exc.conflicts]
            raise ApiError(409, "Conflict", str(exc), {"causes": causes}) from None
        if current is None:
            new["metadata"].setdefault("name", key[2])
            created = self._create(rt, key[1], new)
            return created
        return self._update(rt, key, current, new, sub)

    def _check_precondition(self, rt: ResourceType, current: dict[str, Any], rv: str | None) -> None:
        if rv and rv != current["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {rt.qualified_plural} '
                           f'"{current["metadata"]["name"]}": the object has been modified; please apply your '
                           "changes to the latest version and try again")

    def _update(self, rt: ResourceType, key: ObjectKey, current: dict[str, Any], new: dict[str, Any],
                sub: str | None) -> dict[str, Any]:
        if sub == "status":
            # The /status subresource changes only status. The rest is current's, shared with it (stored objects
            # are replaced, never changed in place) but for the metadata written below.
            merged = {**current, "metadata": copy.deepcopy(current["metadata"])}
            if new.get("status") is None:
                merged.pop("status", None)
            else:
                merged["status"] = copy.deepcopy(new["status"])
            new = merged
        else:
            new = copy.deepcopy(new)
            new["apiVersion"], new["kind"] = rt.api_version, rt.kind
            meta, old_meta = new.setdefault("metadata", {}), current["metadata"]
            for field in ("uid", "creationTimestamp", "generation", "deletionTimestamp",
                          "deletionGracePeriodSeconds", "name", "namespace"):
                if field in old_meta:
                    meta[field] = old_meta[field]
                else:
                    meta.pop(field, None)
            if "managedFields" not in meta and "managedFields" in old_meta:  # an update that omits them keeps them
                meta["managedFields"] = copy.deepcopy(old_meta["managedFields"])
            if rt.status_subresource:  # the main resource ignores status changes
                if "status" in current:
                    new["status"] = copy.deepcopy(current["status"])
                else:
                    new.pop("status", None)
        new = self._admit(rt, new, current)
        if _spec_part(new) != _spec_part(current):
            new["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
        new["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        if new == current:
            return current  # a no-op write: no new resourceVersion and no watch event, as on a real server
        if rt.plural == "customresourcedefinitions" and sub != "status":
            self._register_crd(new, replacing=current)
        new["metadata"]["resourceVersion"] = self._next_rv()
        self._store[key] = new
        self._emit(rt, "MODIFIED", new, current)
        meta = new["metadata"]
        awaiting_kubelet = rt.plural == "pods" and not rt.group and (new.get("spec") or {}).get("nodeName")
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and not awaiting_kubelet:
            return self._remove(rt, key, orphan=False)  # the last finalizer removed
        return new

    # -- deletion and garbage collection ---------------------------------------------------------

    def _delete(self, rt: ResourceType, key: ObjectKey, options: dict[str, Any]) -> dict[str, Any]:
        current = self._get(rt, key)
        pre = options.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != current["metadata"]["uid"]:
            raise ApiError(409, "Conflict", f'Precondition failed: UID in precondition: {pre["uid"]}, '
                                            f'UID in object meta: {current["metadata"]["uid"]}')
        self._check_precondition(rt, current, pre.get("resourceVersion"))
        orphan = options.get("propagationPolicy") == "Orphan" or options.get("orphanDependents") is True
        return self._delete_object(rt, key, options.get("gracePeriodSeconds"), orphan)

    def _delete_object(self, rt: ResourceType, key: ObjectKey, grace: int | None, orphan: bool) -> dict[str, Any]:
        current = self._store[key]
        meta = current["metadata"]
        graceful_pod = rt.plural == "pods" and not rt.group and (current.get("spec") or {}).get("nodeName")
        if graceful_pod and grace is None:
            grace = (current.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        if meta.get("deletionTimestamp"):
            if graceful_pod and grace == 0 and not meta.get("finalizers"):
                return self._remove(rt, key, orphan)  # the kubelet's final delete after the container stopped
            return current
        if meta.get("finalizers") or (graceful_pod and grace):
            # A pod bound to a node waits for its kubelet (the PodRunner) to stop the container, which then
            # deletes it with gracePeriodSeconds=0; objects with finalizers wait for their controllers.
            # Differs from a real API server: Orphan/Foreground of a deferred deletion act as Background.
            marked = copy.deepcopy(current)
            when = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=grace or 0)
            marked["metadata"]["deletionTimestamp"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
            marked["metadata"]["deletionGracePeriodSeconds"] = grace or 0
            marked["metadata"]["resourceVersion"] = self._next_rv()
            self._store[key] = marked
            self._emit(rt, "MODIFIED", marked, current)
            return marked
        return self._remove(rt, key, orphan)

    def _remove(self, rt: ResourceType, key: ObjectKey, orphan: bool) -> dict[str, Any]:
        obj = copy.deepcopy(self._store.pop(key))
        self._uids.pop(obj["metadata"]["uid"], None)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self._emit(rt, "DELETED", obj, None)
        if rt.plural == "customresourcedefinitions":
            self._unregister_crd(obj)
        if rt.plural == "namespaces" and not rt.group:
            # Differs from a real API server: the namespace's content goes at once, with no Terminating phase.
            for other_key in [k for k in self._store if k[1] == key[2]]:
                if other_key in self._store:
                    self._delete_object(self._types[other_key[0]], other_key, None, orphan=False)
        self._collect_dependents(obj["metadata"]["uid"], orphan)
        return obj

    def _collect_dependents(self, owner_uid: str, orphan: bool) -> None:
        """Background cascading deletion: dependents whose owners are all gone are deleted, recursively.

        Differs from a real API server: this runs inside the owner's delete request instead of in the
        asynchronous garbage collector, so dependents are gone (or marked) when the delete returns.
        """
        for key in [k for k, o in self._store.items()
                    if any(r.get("uid") == owner_uid for r in o["metadata"].get("ownerReferences") or [])]:
            obj = self._store.get(key)
            if obj is None:
                continue  # already removed by a deeper cascade
            rt = self._types[key[0]]
            remaining = [r for r in obj["metadata"]["ownerReferences"] if r.get("uid") != owner_uid]
            if orphan or any(r.get("uid") in self._uids for r in remaining):
                new = copy.deepcopy(obj)
                if remaining:
                    new["metadata"]["ownerReferences"] = remaining
                else:
                    new["metadata"].pop("ownerReferences", None)
                self._update(rt, key, obj, new, None)
            else:
                self._delete_object(rt, key, None, orphan=False)

    def _delete_collection(self, rt: ResourceType, ns: str | None, query: Any,
                           options: dict[str, Any]) -> dict[str, Any]:
        listed = self._list(rt, ns, query)
        orphan = options.get("propagationPolicy") == "Orphan"
        for obj in listed["items"]:
            key = (rt.key, obj["metadata"].get("namespace"), obj["metadata"]["name"])
            if key in self._store:
                self._delete_object(rt, key, options.get("gracePeriodSeconds"), orphan)
        return listed

    def _bind(self, rt: ResourceType, key: ObjectKey, body: Any) -> dict[str, Any]:
        """``pods/binding``: what a scheduler posts to put a pod on a node (sets spec.nodeName once)."""
        current = self._get(rt, key)
        node = ((body or {}).get("target") or {}).get("name")
        if not node:
            raise ApiError(400, "BadRequest", "a Binding needs target.name")
        if (current.get("spec") or {}).get("nodeName"):
            raise ApiError(409, "Conflict", f'pod {key[2]} is already assigned to node '
                                            f'"{current["spec"]["nodeName"]}"')
        new = copy.deepcopy(current)
        new.setdefault("spec", {})["nodeName"] = node
        new["metadata"]["resourceVersion"] = self._next_rv()
        self._store[key] = new
        self._emit(rt, "MODIFIED", new, current)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def _evict(self, rt: ResourceType, key: ObjectKey, body: Any) -> dict[str, Any]:
        """``pods/eviction`` (``kubectl drain``): the pod gets the ``DisruptionTarget`` condition that tells
        controllers it was evicted, not failed, and is deleted with the Eviction's deleteOptions.

        Differs from a real API server: there are no PodDisruptionBudgets to consult (the policy group serves
        only this subresource), so an eviction is never refused with 429.
        """
        if not isinstance(body, dict) or body.get("kind") != "Eviction" or body.get("apiVersion") not in (
                "policy/v1", "policy/v1beta1"):
            raise ApiError(400, "BadRequest", "the body of pods/eviction must be a policy/v1 Eviction")
        if (body.get("metadata") or {}).get("name") not in (None, key[2]):
            raise ApiError(400, "BadRequest", "name in URL does not match name in Eviction object")
        current = self._get(rt, key)
        if not current["metadata"].get("deletionTimestamp") and (current.get("status") or {}).get("phase") not in (
                "Succeeded", "Failed"):
            evicted = copy.deepcopy(current)
            conditions = [c for c in (evicted.setdefault("status", {}).get("conditions") or [])
                          if c.get("type") != "DisruptionTarget"]
            conditions.append({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                               "message": "Eviction API: evicting", "lastTransitionTime": now_rfc3339()})
            evicted["status"]["conditions"] = conditions
            self._update(rt, key, current, evicted, "status")
        self._delete(rt, key, body.get("deleteOptions") or {})
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    # -- CustomResourceDefinitions ---------------------------------------------------------------

    def _crd_types(self, crd: dict[str, Any]) -> list[ResourceType]:
        spec, name = crd.get("spec") or {}, crd["metadata"].get("name", "")
        names, group = spec.get("names") or {}, spec.get("group", "")
        crd_rt = self._types[("apiextensions.k8s.io", "v1", "customresourcedefinitions")]
        errors = []
        for field in ("plural", "kind"):
            if not names.get(field):
                errors.append((f"spec.names.{field}", f"spec.names.{field}: Required value"))
        if not group:
            errors.append(("spec.group", "spec.group: Required value"))
        if names.get("plural") and group and name != f"{names['plural']}.{group}":
            errors.append(("metadata.name", f'metadata.name: Invalid value: "{name}": must be '
                                            'spec.names.plural+"."+spec.group'))
        if not spec.get("versions"):
            errors.append(("spec.versions", "spec.versions: Required value"))
        if errors:
            raise invalid(crd_rt, name, errors)
        types = []
        for index, version in enumerate(spec["versions"]):
            if not version.get("served", True):
                continue
            subresources = version.get("subresources") or spec.get("subresources") or {}
            raw_schema = ((version.get("schema") or {}).get("openAPIV3Schema")
                          or (spec.get("validation") or {}).get("openAPIV3Schema"))
            try:
                schema = CustomResourceSchema(raw_schema) if raw_schema else None
            except Exception as exc:  # a CEL rule that does not compile, a schema jsonschema rejects
                field = f"spec.versions[{index}].schema.openAPIV3Schema"
                raise invalid(crd_rt, name, [(field, f"{field}: Invalid value: {exc}")]) from None
            types.append(ResourceType(
                group, version["name"], names["plural"], names["kind"], spec.get("scope", "Namespaced") == "Namespaced",
                names.get("singular") or names["kind"].lower(), tuple(names.get("shortNames") or ()),
                tuple(names.get("categories") or ()), "status" in subresources, schema,
                list(version.get("additionalPrinterColumns") or []), crd_name=name))
        return types

    def _admit_crd(self, crd: dict[str, Any]) -> dict[str, Any]:
        self._crd_types(crd)  # validates; registration happens once the write is certain
        spec = crd.get("spec") or {}
        stamp = now_rfc3339()
        if (crd.get("status") or {}).get("conditions"):
            return crd  # accepted before; the status subresource keeps it
        crd["status"] = {
            "acceptedNames": spec.get("names") or {},
            "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")],
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                 "message": "no conflicts found", "lastTransitionTime": stamp},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted", "lastTransitionTime": stamp},
            ],
        }
        return crd

    def _register_crd(self, crd: dict[str, Any], replacing: dict[str, Any] | None) -> None:
        """Serve the CRD's resources at once (a real server takes a moment to set Established)."""
        if replacing is not None:
            for rt in [t for t in self._types.values() if t.crd_name == replacing["metadata"]["name"]]:
                self._unregister(rt)
        for rt in self._crd_types(crd):
            self._register(rt)
            if replacing is not None and rt.schema is not None:
                self._reshape_stored(rt)

    def _reshape_stored(self, rt: ResourceType) -> None:
        """Stored objects as the new schema reads them: kube-apiserver prunes and defaults on every read from
        etcd, so a default a CRD update adds shows at once, without a write (no new resourceVersion, no event)."""
        for key in [k for k in self._store if k[0] == rt.key]:
            self._store[key] = rt.schema.prepare(self._store[key])

    def _unregister_crd(self, crd: dict[str, Any]) -> None:
        for rt in [t for t in self._types.values() if t.crd_name == crd["metadata"]["name"]]:
            for key in [k for k in self._store if k[0] == rt.key]:
                if key in self._store:
                    self._remove(rt, key, orphan=False)
            self._unregister(rt)

    # -- watch -----------------------------------------------------------------------------------

    async def _watch(self, raw: aiohttp.web.BaseRequest, rt: ResourceType, ns: str | None,
                     query: Any) -> aiohttp.web.StreamResponse:
        """A watch stream of JSON lines, resuming after ``resourceVersion`` or starting with ADDED for all.

        Differs from a real API server: no BOOKMARK events; ``resourceVersionMatch`` and
        ``sendInitialEvents`` are ignored.
        """
        matches = self._matcher(query)
        as_table = tables.wants_table(raw.headers.get("Accept", ""))
        first = [True]

        def encode(kind: str, obj: dict[str, Any]) -> bytes:
            """One watch event; with ``as=Table`` its object is a one-row Table (column definitions first only)."""
            if as_table and kind != "ERROR":
                obj = tables.table(rt, [obj], obj["metadata"].get("resourceVersion", ""),
                                   query.get("includeObject", ""), headers=first[0])
                first[0] = False
            return _json_bytes({"type": kind, "object": obj}) + b"\n"

        timeout = float(query.get("timeoutSeconds") or 1800)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        since = query.get("resourceVersion") or "0"
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(raw)
        try:
            if since == "0":
                position = self._rv
                for obj in self._list(rt, ns, {k: v for k, v in query.items() if k not in ("limit", "continue")})[
                        "items"]:
                    await response.write(encode("ADDED", obj))
            else:
                position = int(since) if since.isdigit() else self._rv
                if position < self._log_floor:
                    gone = ApiError(410, "Expired", f"too old resource version: {position} ({self._log_floor})")
                    await response.write(_json_bytes({"type": "ERROR", "object": gone.status()}) + b"\n")
                    return response
            while not self._closing:
                wake = self._wakes.get(rt.key) or self._wakes.setdefault(rt.key, asyncio.Event())
                start = bisect.bisect_right(self._log, position, key=lambda e: e[0])
                events = []
                for rv, type_key, kind, obj, old in self._log[start:]:
                    position = rv
                    if type_key != rt.key or (ns is not None and obj["metadata"].get("namespace") != ns):
                        continue
                    now_in, was_in = matches(obj), old is not None and matches(old)
                    if kind == "MODIFIED":
                        kind = "MODIFIED" if now_in and was_in else "ADDED" if now_in else "DELETED" if was_in else ""
                    elif not now_in:
                        kind = ""
                    if kind:
                        events.append(encode(kind, obj) if as_table else self._encoded_event(rv, kind, obj))
                if events:  # what happened since the last wake-up, in one write
                    await response.write(b"".join(events))
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    await asyncio.wait_for(wake.wait(), timeout=min(remaining, 5.0))
                except asyncio.TimeoutError:
                    pass
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # the client went away, or the server is stopping
        return response

    def _encoded_event(self, rv: int, kind: str, obj: dict[str, Any]) -> bytes:
        """The JSON line of a change for every watcher that sees it as ``kind`` (stored objects never change,
        so the line is encoded once, not once a watcher)."""
        line = self._encoded.get((rv, kind))
        if line is None:
            if len(self._encoded) >= ENCODED_EVENTS_KEPT:
                self._encoded.clear()
            line = self._encoded[rv, kind] = _json_bytes({"type": kind, "object": obj}) + b"\n"
        return line

    def close_watches(self) -> None:
        self._closing = True
        for wake in self._wakes.values():
            wake.set()


def _request_factory(message, payload, protocol, writer, task) -> aiohttp.web.BaseRequest:
    return aiohttp.web.BaseRequest(message, payload, protocol, writer, task, asyncio.get_running_loop(),
                                   client_max_size=MAX_REQUEST_BODY_BYTES)


class LocalApiServer:
    """``LocalKubernetesApi`` served on 127.0.0.1 from a background thread with its own event loop.

    Plain HTTP on loopback. A request without a token, or with the admin token of the kubeconfig it writes, may do
    anything; one with a token ``issue_token`` gave out (a ServiceAccount's) is held to RBAC; see ``authorization``.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 pod_log_file: Callable[[str, str], Path] | None = None, state_file: Path | None = None):
        """``state_file``: where the objects are kept across restarts (see ``persistence``); None keeps nothing."""
        self.host, self._requested_port = host, port
        self._state_file = state_file
        self._pod_log_file = pod_log_file
        self.port: int | None = None
        self.api: LocalKubernetesApi | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the API server is not started")
        return f"http://{self.host}:{self.port}"

    def start(self) -> LocalApiServer:
        self._thread = threading.Thread(target=self._run, name="local-apiserver", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise RuntimeError(f"the local API server failed to start: {self._error}") from self._error
        if self.port is None:
            raise RuntimeError("the local API server did not start within 30 s")
        return self

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported to start(); the thread must not die silently
            self._error = exc
            self._ready.set()
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        self.api = LocalKubernetesApi(pod_log_file=self._pod_log_file)
        if self._state_file is not None:
            persistence.load(self.api, self._state_file)
            self.api.make_default_service_accounts()
        async with self.api:
            runner = aiohttp.web.ServerRunner(aiohttp.web.Server(self.api, request_factory=_request_factory),
                                              shutdown_timeout=2.0)
            await runner.setup()
            site = aiohttp.web.TCPSite(runner, self.host, self._requested_port)
            await site.start()
            self.port = runner.addresses[0][1]
            self._ready.set()
            await self._stop.wait()
            self.api.close_watches()
            if self._state_file is not None:
                persistence.save(self.api, self._state_file)
            await runner.cleanup()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread is not None:
            try:
                self._loop.call_soon_threadsafe(self._stop.set)
            except RuntimeError:
                pass  # the loop has already finished
            self._thread.join(15)
        self._thread = None

    def __enter__(self) -> LocalApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def issue_token(self, user: authorization.User) -> str:
        """A bearer token for ``user`` (a ServiceAccount's, as its pod's projected token would be)."""
        assert self.api is not None, "start the server first"
        return self.api.tokens.issue(user)

    def kubeconfig(self, namespace: str = "default", token: str = ADMIN_TOKEN) -> dict[str, Any]:
        return {
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": "ascend-local", "cluster": {"server": self.url}}],
            "users": [{"name": "ascend-local", "user": {"token": token}}],
            "contexts": [{"name": "ascend-local",
                          "context": {"cluster": "ascend-local", "user": "ascend-local", "namespace": namespace}}],
            "current-context": "ascend-local",
        }

    def write_kubeconfig(self, path: str | Path, namespace: str = "default", token: str = ADMIN_TOKEN) -> Path:
        """Write a kubeconfig for kubectl, the ``kubernetes`` client and kopf (temp file, then rename); the admin's
        unless ``token`` says whose."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(yaml.safe_dump(self.kubeconfig(namespace, token), sort_keys=False))
        tmp.replace(path)
        return path
