"""Paginated lists (``limit`` / ``continue``) as kube-apiserver serves them from etcd.

- Items come in etcd key order (``<namespace>/<name>``, or ``<name>`` for cluster-scoped kinds); a page holds up
  to ``limit`` items that match the selectors, and ``metadata.continue`` names where the next page starts.
- Every page of one list is a consistent snapshot at the first page's resourceVersion, which later pages report
  as theirs: the emulator rebuilds that snapshot by undoing the watch log's newer changes.
- ``metadata.remainingItemCount`` is given only when the list has no label or field selector.
- The token is the API server's (``apiserver/pkg/storage/continue.go``): URL-safe base64 without padding of
  ``{"v": "meta.k8s.io/v1", "rv": <int>, "start": "<key after the last item>"}``. A token whose resourceVersion
  the watch log no longer covers answers 410 Expired, one that does not decode 400 BadRequest, and a
  ``resourceVersion`` beside ``continue`` is refused (400), all with kube-apiserver's messages.
"""
from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable
from typing import Any

TOO_OLD = ("The provided continue parameter is too old to display a consistent list result. You can start a new "
           "list without the continue parameter, or use the continue token in this response to retrieve the "
           "remainder of the results. Continuing with the provided token results in an inconsistent list - objects "
           "that were created, modified, or deleted between the time the first chunk was returned and now may show "
           "up in the list.")


class ContinueError(ValueError):
    """A continue token that does not decode: 400 'continue key is not valid: ...'."""


def encode(rv: int, start: str) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(token: str) -> tuple[int, str]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except ValueError as e:
        raise ContinueError(f"continue key is not valid: {e}") from None
    if not isinstance(data, dict) or data.get("v") != "meta.k8s.io/v1":
        raise ContinueError("continue key is not valid: server does not recognize this encoded key")
    rv, start = data.get("rv"), data.get("start")
    if not isinstance(rv, int) or rv <= 0 or not isinstance(start, str) or not start:
        raise ContinueError("continue key is not valid: incorrect encoded start resourceVersion (version "
                            "meta.k8s.io/v1)")
    return rv, start


def storage_key(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]


def snapshot(current: Iterable[dict[str, Any]], newer_changes: Iterable[tuple[str, dict[str, Any], Any]]
             ) -> dict[str, dict[str, Any]]:
    """Objects by storage key as they were before ``newer_changes`` ((kind, object, old object), oldest first)."""
    objects = {storage_key(o): o for o in current}
    for kind, obj, old in reversed(list(newer_changes)):
        key = storage_key(obj)
        if kind == "ADDED":
            objects.pop(key, None)
        elif kind == "MODIFIED" and old is not None:
            objects[key] = old
        elif kind == "DELETED":
            objects[key] = obj
    return objects


def page(objects: dict[str, dict[str, Any]], matches: Callable[[dict[str, Any]], bool], limit: int, start: str,
         rv: int, selected: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(items, list metadata) of the page starting at key ``start``."""
    keys = sorted(k for k in objects if k >= start)
    items: list[dict[str, Any]] = []
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    for i, key in enumerate(keys):
        if matches(objects[key]):
            items.append(objects[key])
        if limit and len(items) == limit:
            if i + 1 < len(keys):  # more keys in the range, matching or not (as etcd's range says)
                meta["continue"] = encode(rv, key + "\x00")
                if not selected:
                    meta["remainingItemCount"] = len(keys) - i - 1
            break
    return items, meta
