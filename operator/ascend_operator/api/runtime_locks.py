"""A runtime's ``lockedFields`` refused at apply time: ValidatingAdmissionPolicies that kube-apiserver evaluates
against every runtime a new job names, generated from the same schema the operator merges with.

A policy's parameters are the runtimes themselves (``paramKind``), selected by a binding with an empty selector:
the API server evaluates the policy once per runtime of that kind (for the namespaced kind, those in the job's
namespace), and each validation first asks whether the job names that runtime. One validation per field a
runtime may set: when a locked path covers it and the job sets it to anything but the runtime's value, the job
is refused with the field, the runtime and the locked path, before it is stored.

The policy is the early answer and the operator stays the authority (``ascend_operator.kinds.runtimes``): the rules are
written to refuse only what the operator's merge would refuse (a value the API server defaulted counts as not
set; maps are compared key by key, ``env`` by name, other lists whole), a path locked below the level checked
here (``nodeSelector.pool``) is left to the operator, and ``failurePolicy: Ignore`` keeps a policy error from
blocking every job. A job whose runtime does not exist yet is admitted and fails with RuntimeNotFound.
"""
from __future__ import annotations

import json
import sys
from typing import Any

from .admission import match_constraints, policy_file, write_policy_files
from .crdgen import openapi_schema
from .group import API_GROUP, API_VERSION, CHECKPOINT_CONVERT, DATASET_PREP, RUNTIME_KINDS, TRAIN_JOB, Kind
from .runtime import RUNTIME_FIELDS, SINGLE_POD_FIELDS
from .single_pod import DatasetPrepSpec
from .train_job import AscendTrainJobSpec

ADMISSION = "admissionregistration.k8s.io/v1"
POLICY_PREFIX = "ascend-train-runtime-locks"
LIST_MAP_KEYS = {"env": "name"}  # as the merge: env items are matched by name, other lists replaced whole


def _has(root: str, path: list[str]) -> str:
    return " && ".join(f"has({'.'.join([root, *path[:i + 1]])})" for i in range(len(path)))


def _leaves(schema: dict[str, Any], path: list[str]):
    """(path, schema) of each field the checks compare: struct properties are walked into, the rest compared."""
    props = schema.get("properties")
    if props and schema.get("type") == "object":
        for key, sub in props.items():
            yield from _leaves(sub, [*path, key])
    else:
        yield path, schema


def _unchanged(path: list[str], schema: dict[str, Any]) -> str:
    """CEL, given the job sets ``path``: the merge leaves the runtime's value there as it is. The job's and the
    runtime's fields are of two CRDs' types, which CEL's type check never finds equal: both are compared as
    ``dyn`` (by value, at run time)."""
    job, tmpl = (f"dyn({'.'.join([root, *path])})" for root in ("object.spec", "params.spec.template"))
    in_tmpl = _has("params.spec.template", path)
    if path[-1] in LIST_MAP_KEYS and len(path) == 1:
        return f"{job}.all(e, {in_tmpl} && {tmpl}.exists(r, r == e))"
    if schema.get("type") == "object":  # a map (typed values or free-form): the job's keys win one by one
        return f"{job}.all(k, {in_tmpl} && k in {tmpl} && {job}[k] == {tmpl}[k])"
    same = f"({in_tmpl} && {job} == {tmpl})"
    if "default" in schema:  # filled in by the API server (or written as the default): not the job's own
        return f"({job} == {json.dumps(schema['default'])} || {same})"
    return same


def _validation(path: list[str], schema: dict[str, Any], runtime: str) -> dict[str, str]:
    dotted = ".".join(path)
    covers = f"variables.locked.exists(l, l == '{dotted}' || '{dotted}'.startsWith(l + '.'))"
    return {
        "expression": f"!variables.named || !({covers}) || !({_has('object.spec', path)}) || "
                      f"{_unchanged(path, schema)}",
        "messageExpression": (f"'spec.{dotted}: ' + {runtime} + ' locks ' + variables.locked.filter(l, l == "
                              f"'{dotted}' || '{dotted}'.startsWith(l + '.'))[0] + ' (lockedFields): the job may "
                              f"not change it'"),
        "reason": "Forbidden",
    }


def _policy(name: str, kinds: tuple[Kind, ...], fields: tuple[str, ...], spec_schema: dict[str, Any],
            runtime: Kind) -> list[dict[str, Any]]:
    namespaced = runtime is not RUNTIME_KINDS[1]
    label = ("'" + runtime.kind + " ' + params.metadata.namespace + '/' + params.metadata.name" if namespaced
             else "'" + runtime.kind + " ' + params.metadata.name")
    named_kind = ("(has(object.spec.runtimeRef.kind) ? object.spec.runtimeRef.kind : "
                  f"'{RUNTIME_KINDS[1].kind}') == '{runtime.kind}'")
    validations = [_validation(path, schema, label) for field in fields
                   for path, schema in _leaves(spec_schema["properties"][field], [field])]
    policy = {
        "apiVersion": ADMISSION, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Ignore",
            "paramKind": {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": runtime.kind},
            "matchConstraints": match_constraints([{
                "apiGroups": [API_GROUP], "apiVersions": [API_VERSION], "operations": ["CREATE"],
                "resources": [k.plural for k in kinds]}]),
            "variables": [
                {"name": "named", "expression": "has(object.spec.runtimeRef) && object.spec.runtimeRef.name == "
                                                f"params.metadata.name && {named_kind}"},
                {"name": "locked", "expression": "has(params.spec.lockedFields) ? params.spec.lockedFields : []"}],
            "validations": validations}}
    binding = {
        "apiVersion": ADMISSION, "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "paramRef": {"selector": {}, "parameterNotFoundAction": "Allow"}}}
    return [policy, binding]


def admission_objects() -> list[dict[str, Any]]:
    """The policies and bindings: train jobs and single-pod kinds (the fields each takes), per runtime kind."""
    out = []
    for runtime in RUNTIME_KINDS:
        scope = "cluster" if runtime is RUNTIME_KINDS[1] else "namespaced"
        out += _policy(f"{POLICY_PREFIX}-jobs-{scope}", (TRAIN_JOB,), RUNTIME_FIELDS,
                       openapi_schema(AscendTrainJobSpec), runtime)
        out += _policy(f"{POLICY_PREFIX}-single-pod-{scope}", (DATASET_PREP, CHECKPOINT_CONVERT), SINGLE_POD_FIELDS,
                       openapi_schema(DatasetPrepSpec), runtime)
    return out


def render_admission(helm: bool = False) -> str:
    """The YAML file; for the chart, inside ``trainingRuntimes.lockAtApply``."""
    return policy_file(admission_objects(),
                       "# Generated by `make crds` from operator/ascend_operator/api/runtime_locks.py: a training "
                       "runtime's\n# lockedFields refused at apply time (docs/runtimes.md). Do not edit.\n",
                       "trainingRuntimes.lockAtApply" if helm else None)


def main(argv: list[str] | None = None) -> int:
    return write_policy_files(argv, "Write the runtime-lock admission policies.", render_admission)


if __name__ == "__main__":
    sys.exit(main())
