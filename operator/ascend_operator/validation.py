"""Offline validation of our custom resources (``ascend-train validate``, ``ascend-train apply --dry-run``).

The checks the operator makes, without a cluster: fields the CRD generated from the pydantic models does not know
(kube-apiserver would prune them or, under ``fieldValidation=Strict``, refuse them), then the spec's pydantic model
itself, the single source of truth that also generates the CRD's bounds, enums and CEL rules, then an AscendTrainJob's
memory plan (a layout that cannot fit the device's memory is refused with its figures, as the operator refuses it). Every problem of every
document is reported at once as ``file:line: field: message``, an unknown field with the nearest known name ("did
you mean ..."). What only kube-apiserver can judge (its CEL evaluation, admission) is judged by ``kubectl apply
--dry-run=server`` against a cluster.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError

from ascend_engine.config.loader import yaml_lines

from .kinds import plan
from .api.crdgen import crd
from .api.group import API_GROUP as GROUP, TRAIN_JOB
from .api.resources import RESOURCES


@dataclass(frozen=True)
class Problem:
    source: str
    line: int | None
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line else self.source
        return f"{where}: {self.field}: {self.message}"


def _line(lines: dict[tuple, int], path: tuple) -> int | None:
    for n in range(len(path), -1, -1):  # the deepest part of the path that is written in the file
        if path[:n] in lines:
            return lines[path[:n]]
    return None


def _schemas() -> dict[str, dict[str, Any]]:
    """Kind -> the OpenAPI schema of its served version, from the CRD generated from the models."""
    return {kind: crd(resource)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            for kind, resource in RESOURCES.items()}


def _unknown_fields(value: Any, schema: dict[str, Any], path: tuple) -> list[tuple[tuple, str]]:
    """Fields the schema does not know (the API server would drop them silently), with the nearest known name."""
    found: list[tuple[tuple, str]] = []
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        if schema.get("x-kubernetes-preserve-unknown-fields") or extra is True:
            return found
        for key, item in value.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is None:
                close = difflib.get_close_matches(str(key), list(props), n=1, cutoff=0.6)
                hint = f' (did you mean "{close[0]}"?)' if close else \
                    f" (known: {', '.join(sorted(props))})" if len(props) <= 12 else ""
                found.append((path + (key,), f'unknown field "{key}"{hint}'))
            else:
                found.extend(_unknown_fields(item, sub, path + (key,)))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            found.extend(_unknown_fields(item, schema["items"], path + (index,)))
    return found


def _without(value: Any, paths: list[tuple]) -> Any:
    """A copy of ``value`` without the keys at ``paths`` (the unknown fields found)."""
    if not paths:
        return value
    if isinstance(value, dict):
        return {k: _without(v, [p[1:] for p in paths if p[0] == k and len(p) > 1]) for k, v in value.items()
                if (k,) not in paths}
    if isinstance(value, list):
        return [_without(v, [p[1:] for p in paths if p[0] == i and len(p) > 1]) for i, v in enumerate(value)]
    return value


def validate_document(doc: dict[str, Any], lines: dict[tuple, int], source: str,
                      schemas: dict[str, dict[str, Any]]) -> list[Problem]:
    problems: list[Problem] = []

    def add(path: tuple, message: str) -> None:
        field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".") or "(root)"
        problems.append(Problem(source, _line(lines, path), field, message))

    kind, api_version = doc.get("kind"), str(doc.get("apiVersion") or "")
    if not (doc.get("metadata") or {}).get("name"):
        add(("metadata", "name"), "Required value")
    if api_version.split("/")[0] != GROUP:
        return problems  # not ours: the cluster's own kinds are left to its API server
    if kind not in schemas:
        close = difflib.get_close_matches(str(kind), list(schemas), n=1)
        add(("kind",), f'unknown kind "{kind}" in {GROUP}' + (f' (did you mean "{close[0]}"?)' if close else ""))
        return problems
    body = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}
    unknown = _unknown_fields(body, schemas[kind], ())
    for path, message in unknown:
        add(path, message)
    if not isinstance(doc.get("spec"), dict):
        add(("spec",), "Required value: an object")
        return problems
    try:
        # Without the unknown fields: a model that refuses an extra field runs none of its own checks, so a typo
        # would hide the other problems of the same object (a globalBatchSize that is no multiple of the micro
        # batch) until the typo is fixed and the spec sent again.
        spec = RESOURCES[kind].spec.model_validate(_without(doc["spec"], [p[1:] for p, _ in unknown
                                                                          if p[:1] == ("spec",)]))
    except ValidationError as exc:
        for error in exc.errors():
            if error["type"] != "extra_forbidden":  # reported above, with the nearest known name
                add(("spec",) + tuple(error["loc"]), error["msg"].removeprefix("Value error, "))
        return problems
    if kind == TRAIN_JOB.kind:  # the memory plan, as the operator checks it before creating pods (docs/plan.md)
        too_big = plan.refusal(plan.job_plan(spec))
        if too_big:
            add(("spec", "train"), f"{plan.REFUSED}: {too_big}")
    return problems


def validate_text(text: str, source: str) -> tuple[list[dict[str, Any]], list[Problem]]:
    """The documents of a YAML text and every problem in them (YAML syntax errors included)."""
    try:
        nodes = [n for n in yaml.compose_all(text) if n is not None]
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        return [], [Problem(source, mark.line + 1 if mark else None, "(yaml)", str(getattr(exc, "problem", exc)))]
    schemas = _schemas()
    problems: list[Problem] = []
    for node, doc in zip(nodes, docs):
        lines = yaml_lines(node)
        if not isinstance(doc, dict) or not doc.get("kind"):
            problems.append(Problem(source, node.start_mark.line + 1, "kind", "a document needs apiVersion and kind"))
            continue
        problems.extend(validate_document(doc, lines, source, schemas))
    problems.extend(_runtime_problems(nodes, docs, source))
    return docs, problems


def _runtime_problems(nodes: list[Any], docs: list[Any], source: str) -> list[Problem]:
    """A job that names a training runtime given in the same text, checked against it as the operator will check it
    (runtimes.resolve: locked fields, an image from one of them): refused here, before anything is applied. A
    runtime that is not in the text is the cluster's, and the operator checks against it."""
    from .kinds import runtimes  # here: the merge needs the job CRD's schema, built on first use

    given = {(d.get("kind"), ((d.get("metadata") or {}).get("namespace") or "default")
              if d.get("kind") == "AscendTrainingRuntime" else None, (d.get("metadata") or {}).get("name")): d
             for d in docs if isinstance(d, dict) and str(d.get("kind", "")).endswith("TrainingRuntime")}
    problems = []
    for node, doc in zip(nodes, docs):
        spec = doc.get("spec") if isinstance(doc, dict) and doc.get("kind") == TRAIN_JOB.kind else None
        ref = spec.get("runtimeRef") if isinstance(spec, dict) else None
        if not isinstance(ref, dict):
            continue
        namespace = (doc.get("metadata") or {}).get("namespace") or "default"

        def get(kind: str, ns: str, name: str) -> dict[str, Any] | None:
            return given.get((kind, ns if kind == "AscendTrainingRuntime" else None, name))

        if get(ref.get("kind") or "ClusterAscendTrainingRuntime", namespace, ref.get("name")) is None:
            continue
        try:
            runtimes.resolve(spec, None, namespace, get)
        except runtimes.Refused as e:
            problems.append(Problem(source, node.start_mark.line + 1, "spec.runtimeRef", f"{e.reason}: {e}"))
    return problems
