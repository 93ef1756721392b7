"""Training runtimes (api/runtime.py): a job's spec.runtimeRef resolved into the job's spec.

The merge, as Kubeflow Trainer v2 documents for a TrainJob over its runtime: what the job sets wins, field by field;
objects (nodeSelector, resources, devices, affinity, securityContext, ...) are merged key by key, recursively;
``env`` is merged by name (it is a list-map keyed by name in the CRD); every other list (tolerations, volumes,
volumeMounts, imagePullSecrets, envFrom) is replaced as a whole. The API server fills the job schema's defaults
in, so a job value equal to its schema default counts as not set: the runtime's value wins over it.

A runtime's ``lockedFields`` must come out of the merge exactly as the runtime has them; a job that changes one
fails before any pod exists (reason RuntimeFieldLocked), naming the runtime and the field. The operator resolves
the runtime once, when it first sees the job, and records it in status.runtime (name, generation, hash and the
template used); every later reconcile (restarts, resizes, resume) merges that recorded copy, never the live
runtime, so editing or deleting a runtime changes no job that exists.

A DatasetPrep or CheckpointConvert may name a runtime too: it takes every field but the devices, HCCL and gang
settings (one pod, on CPU unless it asks for a device itself).
"""
from __future__ import annotations

import copy
import hashlib
import json
from functools import lru_cache
from typing import Any, Callable

from pydantic import BaseModel

from ..api.crdgen import openapi_schema
from ..api.runtime import RUNTIME_FIELDS, SINGLE_POD_FIELDS
from ..api.train_job import AscendTrainJobSpec

_MISSING = object()
LIST_MAP_KEYS = {("env",): "name"}  # lists merged by key instead of replaced

NOT_FOUND = "RuntimeNotFound"
LOCKED = "RuntimeFieldLocked"
INCOMPLETE = "RuntimeIncomplete"


class Refused(Exception):
    """A job its runtime cannot serve: ``reason`` for the Failed condition, the message names runtime and field."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@lru_cache(maxsize=4)
def job_schema(model: type[BaseModel] = AscendTrainJobSpec) -> dict[str, Any]:
    """A kind's spec CRD schema: its defaults are what the API server fills into a stored job."""
    return openapi_schema(model)


def _sub(schema: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    return ((schema or {}).get("properties") or {}).get(key)


def _merge(runtime: Any, job: Any, schema: dict[str, Any] | None, path: tuple[str, ...]) -> Any:
    if job is _MISSING:
        return copy.deepcopy(runtime)
    if isinstance(runtime, dict) and isinstance(job, dict):
        out = dict(job)
        for key, value in runtime.items():
            out[key] = _merge(value, job.get(key, _MISSING), _sub(schema, key), path + (key,))
        return out
    if isinstance(runtime, list) and isinstance(job, list) and path in LIST_MAP_KEYS:
        key = LIST_MAP_KEYS[path]
        mine = {item.get(key) for item in job}
        return [copy.deepcopy(item) for item in runtime if item.get(key) not in mine] + list(job)
    if schema is not None and "default" in schema and job == schema["default"]:
        return copy.deepcopy(runtime)  # filled in by the API server (or written as the default): not the job's own
    return job


def merge(template: dict[str, Any], spec: dict[str, Any], model: type[BaseModel] = AscendTrainJobSpec
          ) -> dict[str, Any]:
    """The job's spec over the runtime's template (only the fields a runtime may set and the kind takes)."""
    schema = job_schema(model)
    fields = RUNTIME_FIELDS if model is AscendTrainJobSpec else SINGLE_POD_FIELDS
    out = dict(spec)
    for key, value in template.items():
        if key in fields and value is not None:
            out[key] = _merge(value, spec.get(key, _MISSING), _sub(schema, key), (key,))
    return out


def _at(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def locked_changes(template: dict[str, Any], locked: list[str], merged: dict[str, Any]) -> list[str]:
    """The locked fields the merge changed: a locked field must end up exactly as the runtime has it."""
    return [path for path in locked if _at(merged, path) != _at(template, path)]


def template_hash(template: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:16]


def describe(ref: dict[str, Any], namespace: str) -> str:
    kind = ref.get("kind") or "ClusterAscendTrainingRuntime"
    return f"{kind} {ref['name']}" if kind == "ClusterAscendTrainingRuntime" else f"{kind} {namespace}/{ref['name']}"


def snapshot(ref: dict[str, Any], runtime: dict[str, Any]) -> dict[str, Any]:
    """What status.runtime records of the runtime a job was resolved against."""
    template = (runtime.get("spec") or {}).get("template") or {}
    return {"kind": ref.get("kind") or "ClusterAscendTrainingRuntime", "name": ref["name"],
            "generation": runtime.get("metadata", {}).get("generation"), "hash": template_hash(template),
            "template": template, "lockedFields": list((runtime.get("spec") or {}).get("lockedFields") or [])}


def resolve(spec: dict[str, Any], recorded: dict[str, Any] | None, namespace: str,
            get_runtime: Callable[[str, str, str], dict[str, Any] | None],
            model: type[BaseModel] = AscendTrainJobSpec) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the job's spec merged over its runtime, the snapshot to record in status.runtime, or None when the status
    already holds one: then that recorded copy is used, not the live runtime). Raises ``Refused``."""
    ref = spec.get("runtimeRef")
    if not ref:
        return spec, None
    new = None
    if recorded and recorded.get("template") is not None:
        snap = recorded
    else:
        runtime = get_runtime(ref.get("kind") or "ClusterAscendTrainingRuntime", namespace, ref["name"])
        if runtime is None or runtime.get("metadata", {}).get("deletionTimestamp"):
            kubectl = "catr" if (ref.get("kind") or "ClusterAscendTrainingRuntime").startswith("Cluster") else \
                f"atr -n {namespace}"
            raise Refused(NOT_FOUND, f"spec.runtimeRef: {describe(ref, namespace)} not found: create it, or name "
                                     f"one that exists (kubectl get {kubectl})")
        snap = new = snapshot(ref, runtime)
    merged = merge(snap["template"], spec, model)
    taken = RUNTIME_FIELDS if model is AscendTrainJobSpec else SINGLE_POD_FIELDS
    locked = [path for path in snap.get("lockedFields") or [] if path.split(".", 1)[0] in taken]
    changed = locked_changes(snap["template"], locked, merged)
    if changed and new is not None:  # checked when resolved; a recorded snapshot already passed
        raise Refused(LOCKED, "; ".join(
            f"spec.{path}: {describe(ref, namespace)} locks {path} (lockedFields): the job may not change it "
            f"(the runtime has {json.dumps(_at(snap['template'], path))})" for path in changed))
    if not merged.get("image"):
        raise Refused(INCOMPLETE, f"spec.image: neither the job nor {describe(ref, namespace)} sets image")
    return merged, new
