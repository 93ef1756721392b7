"""Generate the CRDs under ``crds/`` from the pydantic models (``make crds``); a test fails when they drift.

Pydantic writes JSON Schema (draft 2020-12); Kubernetes wants a *structural* OpenAPI v3 schema: no $ref, no
anyOf-with-null (``nullable: true`` instead), boolean ``exclusiveMinimum``, no ``title``/``const``.
"""
from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from .admission import name_schema
from .group import API_GROUP, API_VERSION
from .immutability import create_only
from .resources import RESOURCES, Resource

_DROP = {"title", "$defs", "discriminator"}


def _clean_default(value: Any, schema: dict[str, Any]) -> Any:
    """An object default as the API server should store it: a null (an unset optional) is dropped, since a null
    where the field has a default of its own would be defaulted again on every write (``test_crd_defaults``
    holds the generated schemas to the structural-schema rules)."""
    if not isinstance(value, dict):
        return value
    props = schema.get("properties", {})
    out = {}
    for key, item in value.items():
        sub = props.get(key, {})
        if item is None:
            continue
        out[key] = _clean_default(item, sub)
    return out


def exclusive_bound_rule(key: str, bound: float) -> dict[str, str]:
    """The CEL rule for a strict bound that is not an integer (``Field(lt=0.5)``): ``self < 0.5``."""
    op, words = ("<", "less") if key == "exclusiveMaximum" else (">", "greater")
    return {"rule": f"self {op} {bound!r}", "message": f"should be {words} than {bound!r}",
            "reason": "FieldValueInvalid"}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline $refs and translate JSON Schema constructs to their OpenAPI v3 (structural) forms."""
    if isinstance(node, list):
        return [_resolve(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _resolve(merged, defs)
    node = dict(node)
    any_of = node.pop("anyOf", None)
    if any_of is not None:
        non_null = [s for s in any_of if s.get("type") != "null"]
        if len(non_null) != 1:
            raise ValueError(f"cannot express anyOf {any_of} structurally")
        node = {**_resolve(non_null[0], defs), **node, "nullable": True}
        if node.get("default", ...) is None:
            del node["default"]  # null is the absence of a value; no need to default to it
    out: dict[str, Any] = {}
    strict_rules: list[dict[str, str]] = []
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            if float(value).is_integer():
                out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
                out[key] = True
            else:
                # kube-apiserver compares an integral value (`0`, or `0.0` once kubectl / Helm turned the YAML
                # into JSON) with int64(bound): `0 < int64(0.5)` fails, and it refused the CRD's own default
                # of 0.0. A CEL rule says the same without truncating (and docs/crd_reference.py reads it back).
                strict_rules.append(exclusive_bound_rule(key, value))
        elif key == "properties":
            out[key] = {k: _resolve(v, defs) for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _resolve(value, defs)
        else:
            out[key] = value
    if strict_rules:
        out["x-kubernetes-validations"] = out.get("x-kubernetes-validations", []) + strict_rules
    if isinstance(out.get("default"), dict):
        out["default"] = _clean_default(out["default"], out)
    if out.get("additionalProperties") is False:
        # Structural schemas forbid it next to `properties`; the API server prunes unknown fields instead
        # (and kubectl's server-side field validation reports them).
        del out["additionalProperties"]
    if out.get("x-kubernetes-preserve-unknown-fields"):
        out.pop("additionalProperties", None)
        if out.get("type") == "array":
            out["items"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    elif out.get("additionalProperties") is True:  # dict[str, Any]
        out.pop("additionalProperties")
        out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def openapi_schema(model: type) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _resolve(raw, raw.get("$defs", {}))


def strip_defaults(node: Any) -> Any:
    """The schema without any ``default``: a training runtime's template stores only what its author wrote, so
    that the job's own defaults, not the runtime schema's, apply to what neither sets."""
    if isinstance(node, list):
        return [strip_defaults(n) for n in node]
    if not isinstance(node, dict):
        return node
    return {k: strip_defaults(v) for k, v in node.items() if k != "default"}


_LOOP = re.compile(r"\bself((?:\.\w+)*)\.(?:all|exists|exists_one|map|filter)\((\w+),")
_SELECTION = re.compile(r"\b(\w+)((?:\.\w+)+)(\()?")


def _expression_reads(expression: str) -> set[tuple[str, ...]]:
    """The field paths one CEL expression selects, relative to its ``self`` (a list's items are ``[]``):
    ``self.a.b`` and, inside ``self.a.all(v, ...)``, ``v.x`` as ``a, [], x``; a method call is not a field."""
    loops = {var: tuple(path.split(".")[1:]) + ("[]",) for path, var in _LOOP.findall(expression)}
    out = set()
    for head, rest, call in _SELECTION.findall(expression):
        if head != "self" and head not in loops:
            continue
        names = rest.split(".")[1:]
        out.add((() if head == "self" else loops[head]) + tuple(names[:-1] if call else names))
    return out


def rule_reads(node: dict[str, Any], here: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every field path the schema's CEL rules (and their messages) may read, with each prefix below the node
    that carries the rule (a rule runs only where its node exists): ``self.train.parallel.x`` on spec gives
    (spec, train), (spec, train, parallel) and (spec, train, parallel, x)."""
    out: set[tuple[str, ...]] = set()
    for rule in node.get("x-kubernetes-validations", []):
        for path in _expression_reads(rule["rule"] + " " + rule.get("messageExpression", "")):
            out |= {here + path[:i] for i in range(1, len(path) + 1)}
    for key, sub in node.get("properties", {}).items():
        out |= rule_reads(sub, here + (key,))
    if isinstance(node.get("items"), dict):
        out |= rule_reads(node["items"], here + ("[]",))
    return out


def _trim_default(value: Any, schema: dict[str, Any], path: tuple[str, ...], read: set[tuple[str, ...]]) -> Any:
    if not isinstance(value, dict):
        return value
    props = schema.get("properties", {})
    return {k: _trim_default(v, props.get(k, {}), path + (k,), read) for k, v in value.items()
            if path + (k,) in read}


def defaults_rules_read(node: dict[str, Any], read: set[tuple[str, ...]], path: tuple[str, ...]) -> dict[str, Any]:
    """The schema with a default only where a CEL rule reads the field.

    The API server stores every default it fills in, and the creator's managedFields list each of those fields: a
    job stored with every section's every default (grpo, preference, lora, numerics, runPolicy, devices, ... for a
    pretraining job) was 6.8 KB, and kube-apiserver decodes, defaults, prunes and converts all of it on every write
    and read of the job (docs/performance.md). The operator and the engine read a spec through the same pydantic
    models, which default what is absent to the same values; what needs a default in the stored object is a CEL
    rule that reads the field (or reads through it), so those keep theirs."""
    out = dict(node)
    if "default" in node and path not in read:
        del out["default"]
    elif isinstance(node.get("default"), dict):
        out["default"] = _trim_default(node["default"], node, path, read)
    if "properties" in node:
        out["properties"] = {k: defaults_rules_read(v, read, path + (k,)) for k, v in node["properties"].items()}
    if isinstance(node.get("items"), dict):
        out["items"] = defaults_rules_read(node["items"], read, path + ("[]",))
    return out


_GUARDED = re.compile(r"!has\(self\.(\w+)\) \|\| (.*)", re.S)


def _top_level_ternary(expression: str) -> bool:
    depth = 0
    for char in expression:
        depth += (char in "([{") - (char in ")]}")
        if char == "?" and depth == 0:
            return True
    return False


def _sunk(rule: dict[str, str], properties: dict[str, Any]) -> tuple[str, dict[str, str]] | None:
    """``rule`` as it reads on the field it guards, when it is ``!has(self.x) || body``, ``x`` is an object of
    this node, every read of the body and its message is under ``self.x.`` and its fieldPath is under ``.x``."""
    match = _GUARDED.fullmatch(rule["rule"])
    if not match or _top_level_ternary(match[2]):
        return None
    field, body = match[1], match[2]
    texts = [body] + ([rule["messageExpression"]] if "messageExpression" in rule else [])
    path = rule.get("fieldPath", "")
    if ("properties" not in properties.get(field, {}) or not (path == f".{field}" or path.startswith(f".{field}."))
            or any(re.search(rf"\bself\b(?!\.{field}\.)", text) for text in texts)):
        return None
    moved = {**rule, "rule": body.replace(f"self.{field}.", "self.")}
    if "messageExpression" in rule:
        moved["messageExpression"] = rule["messageExpression"].replace(f"self.{field}.", "self.")
    if path == f".{field}":
        del moved["fieldPath"]
    else:
        moved["fieldPath"] = path.removeprefix(f".{field}")
    return field, moved


def sink_rules(node: dict[str, Any]) -> dict[str, Any]:
    """The schema with each rule ``!has(self.x) || body`` that reads nothing but ``x`` moved onto ``x`` as
    ``body``, the same check with the same message and field path.

    kube-apiserver evaluates every rule of a custom resource on each write, and each field a rule selects costs it
    a copy of the selecting node's whole property schema (CEL's object model for CRDs rebuilds that map at every
    step): from the spec's 37 properties that is most of a create's CPU. On ``train`` the layout rules select from
    its 13 (docs/performance.md); a job without ``train`` skips them without a guard."""
    out = dict(node)
    properties = dict(node.get("properties", {}))
    kept: list[dict[str, str]] = []
    for rule in node.get("x-kubernetes-validations", []):
        sunk = _sunk(rule, properties)
        if sunk is None:
            kept.append(rule)
        else:
            field, moved = sunk
            properties[field] = {**properties[field],
                                 "x-kubernetes-validations": [*properties[field].get("x-kubernetes-validations", []),
                                                              moved]}
    if "x-kubernetes-validations" in node:
        out["x-kubernetes-validations"] = kept
        if not kept:
            del out["x-kubernetes-validations"]
    if properties:
        out["properties"] = {k: sink_rules(v) for k, v in properties.items()}
    if isinstance(node.get("items"), dict):
        out["items"] = sink_rules(node["items"])
    return out


def crd(resource: Resource) -> dict[str, Any]:
    k = resource.kind
    spec_schema = openapi_schema(resource.spec)
    if resource.job:  # the spec's rules hold from creation on: an update may change runPolicy alone
        spec_schema = create_only(sink_rules(spec_schema))
        read = rule_reads({"properties": {"spec": spec_schema}, "x-kubernetes-validations": resource.root_rules})
        spec_schema = defaults_rules_read(spec_schema, read, ("spec",))
    else:
        spec_schema = strip_defaults(spec_schema)
    properties = {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": name_schema(),
                  "spec": spec_schema}
    if resource.job:
        # A job the operator has not written yet reads as generation 1 observed 0: kstatus (Flux's wait, the
        # chart's Argo CD check) says InProgress until the operator's first status, instead of Current for an
        # object with no status at all (lifecycle/kstatus.py).
        properties["status"] = {**openapi_schema(resource.status), "default": {"observedGeneration": 0}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": k.crd_name, "labels": {"app.kubernetes.io/part-of": "ascend-train-operator"}},
        "spec": {
            "group": API_GROUP,
            "scope": resource.scope,
            "names": {"kind": k.kind, "plural": k.plural, "singular": k.singular, "shortNames": [k.short],
                      "listKind": f"{k.kind}List",
                      "categories": ["ascendtrain", "all"] if resource.job else ["ascendtrain"]},
            "versions": [{
                "name": API_VERSION,
                "served": True,
                "storage": True,
                **({"subresources": {"status": {}}} if resource.job else {}),
                "additionalPrinterColumns": [
                    {"name": n, "type": t, "jsonPath": p, "description": d} | ({"priority": rest[0]} if rest else {})
                    for n, t, p, d, *rest in resource.columns
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": resource.description,
                    "required": ["spec"],
                    "properties": properties,
                    **({"x-kubernetes-validations": list(resource.root_rules)} if resource.root_rules else {}),
                }},
            }],
        },
    }


def render_all() -> dict[str, str]:
    """File name -> YAML text for every kind."""
    header = "# GENERATED by `make crds` from operator/ascend_operator/api (pydantic models). Do not edit.\n"
    return {f"{r.kind.crd_name}.yaml": header + yaml.safe_dump(crd(r), sort_keys=False, width=120)
            for r in RESOURCES.values()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", metavar="DIR", help="write the CRDs into DIR (otherwise print them)")
    args = parser.parse_args(argv)
    files = render_all()
    if not args.write:
        sys.stdout.write("---\n".join(files.values()))
        return 0
    out = Path(args.write)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text)
        print(f"wrote {out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
