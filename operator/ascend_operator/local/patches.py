"""Patch bodies the API server accepts: JSON merge patch (RFC 7386) and JSON patch (RFC 6902)."""
from __future__ import annotations

import copy
from typing import Any


class PatchError(ValueError):
    """A patch that cannot apply; the API answers 422 (JSON patch test failures) or 400."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes a key, anything else (lists too) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> Any:
    for part in parts[:-1]:
        try:
            doc = doc[int(part)] if isinstance(doc, list) else doc[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise PatchError(f"path /{'/'.join(parts)} does not exist") from None
    return doc


def json_patch(document: Any, operations: list[dict[str, Any]]) -> Any:
    """RFC 6902 operations add, remove, replace, test, move and copy on a copy of ``document``."""
    doc = copy.deepcopy(document)
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations")
    for op in operations:
        kind, parts = op.get("op"), _pointer(op.get("path", ""))
        if kind in ("move", "copy"):
            src = _pointer(op.get("from", ""))
            holder = _parent(doc, src)
            try:
                value = holder[int(src[-1])] if isinstance(holder, list) else holder[src[-1]]
            except (KeyError, IndexError, ValueError):
                raise PatchError(f"from path {op.get('from')} does not exist") from None
            if kind == "move":
                doc = json_patch(doc, [{"op": "remove", "path": op["from"]}])
            doc = json_patch(doc, [{"op": "add", "path": op["path"], "value": copy.deepcopy(value)}])
            continue
        if not parts:
            if kind in ("add", "replace"):
                doc = copy.deepcopy(op.get("value"))
                continue
            raise PatchError(f"operation {kind!r} needs a non-empty path")
        holder, last = _parent(doc, parts), parts[-1]
        if kind == "test":
            current = holder[int(last)] if isinstance(holder, list) else holder.get(last)
            if current != op.get("value"):
                raise PatchError(f"test failed at {op['path']}")
        elif kind == "add":
            if isinstance(holder, list):
                holder.insert(len(holder) if last == "-" else int(last), copy.deepcopy(op.get("value")))
            else:
                holder[last] = copy.deepcopy(op.get("value"))
        elif kind in ("remove", "replace"):
            try:
                if isinstance(holder, list):
                    index = int(last)
                    holder[index]  # noqa: B018 -- existence check
                elif last not in holder:
                    raise KeyError(last)
            except (KeyError, IndexError, ValueError):
                raise PatchError(f"path {op['path']} does not exist") from None
            if kind == "remove":
                del holder[int(last) if isinstance(holder, list) else last]
            else:
                holder[int(last) if isinstance(holder, list) else last] = copy.deepcopy(op.get("value"))
        else:
            raise PatchError(f"unknown JSON patch operation {kind!r}")
    return doc
