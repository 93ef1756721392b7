"""Server-side apply: ``PATCH`` with ``application/apply-patch+yaml`` (``kubectl apply --server-side``).

The applied configuration is the manager's whole intent. As on kube-apiserver, the fields it sets become that
manager's (recorded in ``metadata.managedFields``, operation ``Apply``, in the ``FieldsV1`` format); a field it
set last time and leaves out now is removed unless another applier also owns it; a field another applier owns
with a different value is a 409 Conflict unless ``force=true``, which takes it over. What no applier owns (the
server's defaults, fields written by plain updates) stays as it is.

Differs from a real API server: lists are atomic (a real one merges ``x-kubernetes-list-type: map`` lists, such
as a Pod's containers, by key); ownership is tracked for appliers only, so fields written by updates (PUT,
merge patch) never conflict and kubectl's client-side-apply migration finds nothing to migrate.
"""
from __future__ import annotations

import copy
import datetime
from typing import Any

Path = tuple[str, ...]
_METADATA_FIELDS = ("labels", "annotations")  # the parts of metadata an applier can own


class ApplyConflict(Exception):
    """Fields owned by other appliers with other values; answered as 409 Conflict."""

    def __init__(self, conflicts: list[tuple[str, Path]]):
        self.conflicts = conflicts
        lines = [f'conflict with "{manager}": .{".".join(path)}' for manager, path in conflicts]
        super().__init__(f"Apply failed with {len(lines)} conflict{'s' if len(lines) > 1 else ''}: "
                         + "\n".join(lines))


def _owned_part(config: dict[str, Any]) -> dict[str, Any]:
    body = {k: v for k, v in config.items() if k not in ("apiVersion", "kind", "metadata", "status")}
    meta = {k: v for k, v in (config.get("metadata") or {}).items() if k in _METADATA_FIELDS}
    return body | ({"metadata": meta} if meta else {})


def leaf_paths(value: Any, prefix: Path = ()) -> set[Path]:
    """Paths of the values a configuration sets; objects recurse, lists and scalars are leaves."""
    if isinstance(value, dict) and value:
        out: set[Path] = set()
        for key, item in value.items():
            out |= leaf_paths(item, prefix + (key,))
        return out
    return {prefix} if prefix else set()


def _fields_v1(paths: set[Path]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path in sorted(paths):
        node = tree
        for part in path:
            node = node.setdefault(f"f:{part}", {})
    return tree


def _paths_of(fields: dict[str, Any], prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for key, sub in (fields or {}).items():
        if not key.startswith("f:"):
            continue
        path = prefix + (key[2:],)
        out |= _paths_of(sub, path) if sub else {path}
    return out


def _lookup(obj: Any, path: Path) -> tuple[bool, Any]:
    for part in path:
        if not isinstance(obj, dict) or part not in obj:
            return False, None
        obj = obj[part]
    return True, obj


def _remove(obj: dict[str, Any], path: Path) -> None:
    """Remove the value at ``path`` and the objects it leaves empty."""
    parents = [obj]
    for part in path[:-1]:
        nxt = parents[-1].get(part)
        if not isinstance(nxt, dict):
            return
        parents.append(nxt)
    parents[-1].pop(path[-1], None)
    for depth in range(len(parents) - 1, 0, -1):
        if parents[depth]:
            break
        parents[depth - 1].pop(path[depth - 1], None)


def _merge(target: dict[str, Any], config: dict[str, Any]) -> None:
    for key, value in config.items():
        if isinstance(value, dict) and value and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def apply(current: dict[str, Any] | None, config: dict[str, Any], manager: str, force: bool,
          api_version: str) -> dict[str, Any]:
    """The object after ``manager`` applies ``config`` to ``current`` (None: the object does not exist yet)."""
    base = copy.deepcopy(current) if current is not None else {"metadata": {}}
    managed = [e for e in base["metadata"].get("managedFields") or [] if isinstance(e, dict)]
    mine = next((e for e in managed if e.get("manager") == manager and e.get("operation") == "Apply"), None)
    others = [e for e in managed if e is not mine and e.get("operation") == "Apply"]
    owned = _owned_part(config)
    wanted = leaf_paths(owned)
    conflicts = []
    for entry in others:
        theirs = _paths_of(entry.get("fieldsV1") or {})
        clashing = {p for p in wanted & theirs if _lookup(base, p) != _lookup(owned, p)}
        if clashing and not force:
            conflicts += [(entry.get("manager", ""), p) for p in sorted(clashing)]
        elif clashing:
            entry["fieldsV1"] = _fields_v1(theirs - clashing)
    if conflicts:
        raise ApplyConflict(conflicts)
    still_owned = set().union(*(_paths_of(e.get("fieldsV1") or {}) for e in others)) if others else set()
    for path in _paths_of((mine or {}).get("fieldsV1") or {}) - wanted - still_owned:
        _remove(base, path)
    _merge(base, owned)
    for key in ("name", "namespace", "generateName"):
        if key in (config.get("metadata") or {}):
            base["metadata"].setdefault(key, config["metadata"][key])
    entry = {"manager": manager, "operation": "Apply", "apiVersion": api_version, "fieldsType": "FieldsV1",
             "fieldsV1": _fields_v1(wanted)}
    if mine is not None and {k: v for k, v in mine.items() if k != "time"} == entry:
        entry = mine  # the same fields again: the entry (and its time) stays, so a no-op apply changes nothing
    else:
        entry["time"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    base["metadata"]["managedFields"] = [e for e in managed if e is not mine and e.get("fieldsV1") != {}] + [entry]
    return base
