"""The local API's objects kept across restarts, as etcd keeps a real cluster's.

``save`` writes every stored object (and the resourceVersion counter) to one JSON file, atomically, when the API
server stops; ``load`` puts them back before it serves again, CustomResourceDefinitions first so their kinds are
served. Pods bound to the node come back as they were; the pod runner then starts their containers again, as a
kubelet does after a node reboot.

Differs from etcd: a process killed with SIGKILL loses the changes since the last start (the file is written on a
clean stop: Ctrl-C, SIGTERM, ``ascend-train local down``).
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

FORMAT = 1
CRD_TYPE = ("apiextensions.k8s.io", "v1", "customresourcedefinitions")


def save(api: Any, path: Path) -> None:
    objects = [{"type": list(key[0]), "object": obj} for key, obj in api._store.items()]
    state = {"format": FORMAT, "resourceVersion": api._rv, "objects": objects}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(path)


def load(api: Any, path: Path) -> int:
    """Restore the objects saved at ``path`` (if any); returns how many."""
    if not path.exists():
        return 0
    try:
        state = json.loads(path.read_text())
    except ValueError as exc:
        raise RuntimeError(f"{path} is not a saved local cluster state ({exc}); start with --fresh") from None
    if state.get("format") != FORMAT:
        raise RuntimeError(f"{path} has state format {state.get('format')}, expected {FORMAT}; start with --fresh")
    entries = sorted(state["objects"], key=lambda e: tuple(e["type"]) != CRD_TYPE)  # CRDs first
    restored = 0
    for entry in entries:
        type_key, obj = tuple(entry["type"]), entry["object"]
        rt = api._types.get(type_key)
        if rt is None:
            logger.warning("dropping saved %s %s: its kind is no longer served", "/".join(type_key),
                           obj["metadata"].get("name"))
            continue
        key = (type_key, obj["metadata"].get("namespace") if rt.namespaced else None, obj["metadata"]["name"])
        api._store[key] = obj
        api._uids[obj["metadata"]["uid"]] = key
        if type_key == CRD_TYPE:
            api._register_crd(obj, replacing=None)
        restored += 1
    api._rv = max(api._rv, int(state.get("resourceVersion", 0)))
    return restored
