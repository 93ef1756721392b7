"""Strategic merge patch (``application/strategic-merge-patch+json``), as apimachinery's ``strategicpatch``
applies it to the built-in kinds: what kubectl sends for ``kubectl apply`` of a Pod, Service, ConfigMap..., and
for ``kubectl patch`` without ``--type``.

The kinds' own OpenAPI schemas say how each list merges (``x-kubernetes-patch-strategy``,
``x-kubernetes-patch-merge-key``, as the Go types' struct tags do): a list with the ``merge`` strategy merges its
items by their merge key (a Service's ports by ``port``, a container's env by ``name``), a list of primitives by
value; every other list is replaced. Maps merge recursively and ``null`` deletes. The directives kubectl uses are
honoured: ``$patch: replace|delete|merge`` (on a map or a list item), ``$retainKeys``,
``$deleteFromPrimitiveList/<list>`` and ``$setElementOrder/<list>``. Custom resources take no strategic merge
patch (kube-apiserver answers 415); the caller checks that.

Differs from a real API server: with ``$setElementOrder``, items the patch does not mention keep their relative
order after the ordered ones, where apimachinery interleaves them by their old positions.
"""
from __future__ import annotations

import copy
from typing import Any

from . import core_schemas
from .patches import PatchError

_DIRECTIVE = "$patch"
_RETAIN = "$retainKeys"
_ORDER = "$setElementOrder/"
_DELETE_PRIMITIVES = "$deleteFromPrimitiveList/"


def apply(original: dict[str, Any], patch: dict[str, Any], schema: dict[str, Any] | None) -> dict[str, Any]:
    """``original`` with ``patch`` merged in, per the kind's ``schema``."""
    if not isinstance(patch, dict):
        raise PatchError("a strategic merge patch must be a JSON object")
    merged = _merge_map(original, patch, core_schemas.resolved(schema))
    if merged is None:
        raise PatchError("a strategic merge patch cannot delete the whole object")
    return merged


def _child(schema: dict[str, Any], key: str) -> dict[str, Any]:
    properties = schema.get("properties") or {}
    if key in properties:
        return core_schemas.resolved(properties[key])
    extra = schema.get("additionalProperties")
    return core_schemas.resolved(extra) if isinstance(extra, dict) else {}


def _strategy(schema: dict[str, Any]) -> tuple[set[str], str | None]:
    strategy = set(str(schema.get("x-kubernetes-patch-strategy") or "").split(",")) - {""}
    return strategy, schema.get("x-kubernetes-patch-merge-key")


def _strip(value: Any) -> Any:
    """A value taken from the patch as it stands, without directives."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items()
                if k not in (_DIRECTIVE, _RETAIN) and not k.startswith((_ORDER, _DELETE_PRIMITIVES))}
    if isinstance(value, list):
        return [_strip(v) for v in value if not (isinstance(v, dict) and set(v) == {_DIRECTIVE})]
    return value


def _merge_map(original: Any, patch: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any] | None:
    """The merged map, or None when the patch deletes it (``$patch: delete``)."""
    directive = patch.get(_DIRECTIVE)
    if directive == "delete":
        return None
    if directive == "replace":
        return _strip(patch)
    if directive not in (None, "merge"):
        raise PatchError(f"Unknown patch type: {directive}")
    result = copy.deepcopy(original) if isinstance(original, dict) else {}
    orders, removals = {}, {}
    for key, value in patch.items():
        if key in (_DIRECTIVE, _RETAIN):
            continue
        if key.startswith(_ORDER):
            orders[key[len(_ORDER):]] = value
        elif key.startswith(_DELETE_PRIMITIVES):
            removals[key[len(_DELETE_PRIMITIVES):]] = value
        elif value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = _merge_map(result.get(key), value, _child(schema, key))
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _merge_list(result.get(key), value, _child(schema, key))
        else:
            result[key] = value
    for key, values in removals.items():
        result[key] = [v for v in result.get(key) or [] if v not in (values or [])]
    for key, order in orders.items():
        if isinstance(result.get(key), list):
            result[key] = _ordered(result[key], order or [], _strategy(_child(schema, key))[1])
    retained = patch.get(_RETAIN)
    if isinstance(retained, list):
        result = {k: v for k, v in result.items() if k in retained}
    return result


def _merge_list(original: Any, patch: list[Any], schema: dict[str, Any]) -> list[Any]:
    strategy, merge_key = _strategy(schema)
    if "merge" not in strategy or any(isinstance(i, dict) and i.get(_DIRECTIVE) == "replace" for i in patch):
        return _strip([i for i in patch if not (isinstance(i, dict) and i.get(_DIRECTIVE) == "replace")])
    result = copy.deepcopy(original) if isinstance(original, list) else []
    if merge_key is None:  # a set of primitives: what the patch adds that is not there yet
        return result + [v for n, v in enumerate(patch) if v not in result and v not in patch[:n]]
    items = core_schemas.resolved(schema.get("items"))
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise PatchError(f"map: {item!r} does not contain declared merge key: {merge_key}")
        found = [n for n, o in enumerate(result) if isinstance(o, dict) and o.get(merge_key) == item[merge_key]]
        if item.get(_DIRECTIVE) == "delete":
            result = [o for n, o in enumerate(result) if n not in found]
        elif found:
            result[found[0]] = _merge_map(result[found[0]], item, items)
        else:
            result.append(_merge_map(None, item, items))
    return result


def _ordered(items: list[Any], order: list[Any], merge_key: str | None) -> list[Any]:
    """``$setElementOrder``: the items named in ``order`` in that order, then the others as they were."""
    def key(item: Any) -> Any:
        return item.get(merge_key) if merge_key and isinstance(item, dict) else item

    wanted = [o.get(merge_key) if merge_key and isinstance(o, dict) else o for o in order]
    first = sorted((i for i in items if key(i) in wanted), key=lambda i: wanted.index(key(i)))
    return first + [i for i in items if key(i) not in wanted]
