"""The committed CRDs are exactly what the pydantic models generate, and they are structural."""
import re
from pathlib import Path

import yaml

from ascend_operator.api.crdgen import openapi_schema, render_all, rule_reads, sink_rules
from ascend_operator.api.immutability import render as immutable_spec
from ascend_operator.api.resources import RESOURCES
from ascend_operator.api.runtime_locks import render_admission

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "crds"
CHART_POLICIES = ROOT / "charts" / "ascend-train-operator" / "templates" / "runtime-locks.yaml"


def test_committed_crds_match_the_models():
    generated = {**render_all(), "runtime-locks.yaml": render_admission(), "immutable-spec.yaml": immutable_spec()}
    assert CHART_POLICIES.read_text() == render_admission(helm=True), "run `make crds`"
    assert (CHART_POLICIES.parent / "immutable-spec.yaml").read_text() == immutable_spec(helm=True), "run `make crds`"
    committed = {p.name: p.read_text() for p in CRDS.glob("*.yaml")}
    assert set(committed) == set(generated), "run `make crds`"
    for name, text in generated.items():
        assert committed[name] == text, f"{name} drifted from the models: run `make crds`"


def _walk(node, path="schema"):
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}[{i}]")


def test_schemas_are_structural():
    for text in render_all().values():
        schema = yaml.safe_load(text)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for path, node in _walk(schema):
            assert "$ref" not in node and "anyOf" not in node and "title" not in node, path
            if "properties" in node:
                assert "additionalProperties" not in node, path
                assert node.get("type") == "object", path


# What kube-apiserver accepts as a validation rule's reason (apiextensions' FieldValueErrorReason): any other value
# makes the whole CRD invalid, and no job can be created.
RULE_REASONS = {"FieldValueRequired", "FieldValueDuplicate", "FieldValueInvalid", "FieldValueForbidden"}


def test_every_validation_rule_reason_is_one_kube_apiserver_accepts():
    for name, text in render_all().items():
        schema = yaml.safe_load(text)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for path, node in _walk(schema):
            for rule in node.get("x-kubernetes-validations") or []:
                assert rule.get("reason", "FieldValueInvalid") in RULE_REASONS, (name, path, rule)


def test_train_job_crd_has_status_columns_and_short_name():
    crd = yaml.safe_load(render_all()["ascendtrainjobs.ascendtrain.dev.yaml"])
    version = crd["spec"]["versions"][0]
    assert crd["spec"]["names"]["shortNames"] == ["atj"]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Phase", "Iter", "Loss", "Tok/s", "Eval",
                                                                       "Restarts", "Runtime", "Nodes", "Age",
                                                                       "Failure"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert "required" not in spec  # image or runtimeRef, train, evaluation or trainer: CEL rules ask for them
    # A spec's rules run when it is created: an update may change runPolicy alone (api/immutability.py), and a
    # rule evaluated on every status write cost the API server as much as the write itself.
    guarded = [r for r in spec["x-kubernetes-validations"] if r.get("optionalOldSelf")]
    assert len(guarded) == len(spec["x-kubernetes-validations"])
    rules = [r["rule"].removeprefix("oldSelf.hasValue() || (").removesuffix(")") for r in guarded]
    assert "has(self.image) || has(self.runtimeRef)" in rules
    assert "has(self.train) || has(self.trainer) || has(self.evaluation)" in rules
    assert "!has(self.trainer) || !has(self.train)" in rules
    tp = spec["properties"]["train"]["properties"]["parallel"]["properties"]["tensorModelParallelSize"]
    assert tp["default"] == 1 and tp["minimum"] == 1 and tp["description"]


def _schema_nodes(node, path=""):
    """(path, schema) for every schema node: properties, items and additionalProperties, recursively."""
    if not isinstance(node, dict):
        return
    yield path or "<root>", node
    for key, sub in (node.get("properties") or {}).items():
        yield from _schema_nodes(sub, f"{path}.{key}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _schema_nodes(node[key], f"{path}[{key}]")


def _has_null(value) -> bool:
    if isinstance(value, dict):
        return any(_has_null(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_null(v) for v in value)
    return value is None


def test_every_default_survives_defaulting_pruning_and_merge_patches():
    """The structural-schema rules, checked on every default the models generate.

    A default next to ``nullable: true`` is the trap of issue 26: a merge patch's null removes the field and the
    server fills the default back in, so "null means off" never survives a re-apply. A null inside an object
    default is pruned or re-defaulted the same way. (kube-apiserver itself refuses a CRD whose default is not
    pruned-stable or does not validate against its own schema: the test session installs these CRDs, and
    tests/operator/test_manifests_on_the_server.py checks they are served with their defaults.)"""
    for name, text in render_all().items():
        schema = yaml.safe_load(text)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for path, node in _schema_nodes(schema):
            if "default" not in node:
                continue
            where = f"{name}: {path}"
            assert not node.get("nullable"), f"{where}: a nullable field with a default loses its null on apply"
            assert not _has_null(node["default"]), f"{where}: a null inside a default is pruned or re-defaulted"


def test_a_job_crd_defaults_what_its_rules_read_and_nothing_else():
    """A stored job holds the defaults its CEL rules read, so that a rule never meets a missing field the models
    would default (``self.train.parallel.tensorModelParallelSize`` of a job that wrote no ``parallel``), and no
    other default: every one the API server fills in is stored, listed in managedFields and decoded on every
    write (docs/performance.md); the operator's models default the rest."""
    for resource in (r for r in RESOURCES.values() if r.job):
        crd = yaml.safe_load(render_all()[f"{resource.kind.crd_name}.yaml"])
        spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        read = rule_reads(spec)  # what the served CRD's rules read, relative to spec
        for path, node in _schema_nodes(openapi_schema(resource.spec)):
            here = tuple("[]" if items else name for name, items in re.findall(r"\.(\w+)|(\[items\])", path))
            served = _at(spec, here)
            if "default" in node and served is not None:
                kept = "default" in served
                assert kept == (here in read), f"{resource.kind.kind} spec.{'.'.join(here)}: " + (
                    "a rule reads it and its default is gone" if here in read else "defaulted, and no rule reads it")


def _rule_operands(rule: str) -> set[tuple[str, ...]]:
    """The schema paths (relative to the rule's node) whose size a rule's cost depends on: ``self.a.b`` and
    ``oldSelf.a.b``, and ``v.x`` inside ``self.a.all(v, ...)`` (``exists``, ``map``, ``filter`` alike) as
    ``a, [], x``; not those only tested by ``has()`` or measured by ``size()``, which cost 1 whatever the size."""
    rule = re.sub(r"\b(?:has|size)\([\w.]+\)", "1", rule.replace("oldSelf.hasValue()", "1"))
    loops = {v: tuple(p.split(".")[1:]) + ("[]",) for p, v in
             re.findall(r"((?:self|oldSelf)(?:\.\w+)*)\.(?:all|exists|exists_one|map|filter)\((\w+),", rule)}
    paths = set()
    for head, rest in re.findall(r"\b(self|oldSelf|\w+)((?:\.\w+)+)", rule):
        names = tuple(n for n in rest.split(".")[1:] if n not in ("all", "exists", "exists_one", "map", "filter",
                                                                 "startsWith", "endsWith", "matches", "contains"))
        if head in ("self", "oldSelf"):
            paths.add(names)
        elif head in loops:
            paths.add(loops[head] + names)
    for head in re.findall(r"\b(self|oldSelf)\b(?!\.)", rule):
        paths.add(())
    return paths


def _at(node: dict, path: tuple[str, ...]) -> dict | None:
    for name in path:
        node = node.get("items") if name == "[]" else (node.get("properties") or {}).get(name)
        if node is None:
            return None
    return node


def test_a_rule_that_reads_only_train_runs_on_train_with_the_same_field_path_and_message():
    """kube-apiserver pays for every field a rule selects with a copy of the selecting node's property schemas
    (docs/performance.md); a rule guarded by ``!has(self.train)`` that reads nothing else runs on ``train``."""
    leaf = {"type": "integer"}
    train = {"type": "object", "properties": {"parallel": {"type": "object", "properties": {"tp": leaf}},
                                              "model": {"type": "object", "properties": {"heads": leaf}}}}
    rules = [
        {"rule": "!has(self.train) || self.train.model.heads % self.train.parallel.tp == 0",
         "messageExpression": "'%d'.format([self.train.parallel.tp])", "message": "m",
         "fieldPath": ".train.parallel.tp"},
        {"rule": "!has(self.train) || self.nnodes % self.train.parallel.tp == 0", "message": "reads nnodes"},
        {"rule": "!has(self.train) || self.train.model.heads > 0 ? true : false", "message": "ternary"},
        {"rule": "!has(self.train) || has(self.train) && self.train.model.heads > 0", "message": "self.train"},
        {"rule": "!has(self.train) || self.train.model.heads > 0", "message": "elsewhere", "fieldPath": ".nnodes"},
    ]
    schema = sink_rules({"type": "object", "properties": {"nnodes": leaf, "train": train},
                         "x-kubernetes-validations": rules})
    assert schema["properties"]["train"]["x-kubernetes-validations"] == [
        {"rule": "self.model.heads % self.parallel.tp == 0", "messageExpression": "'%d'.format([self.parallel.tp])",
         "message": "m", "fieldPath": ".parallel.tp"}]
    assert schema["x-kubernetes-validations"] == rules[1:]
    job = yaml.safe_load(render_all()["ascendtrainjobs.ascendtrain.dev.yaml"])
    spec = job["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    on_train = spec["properties"]["train"]["x-kubernetes-validations"]
    assert len(on_train) >= 20 and not any(re.search(r"self\.train\b", r["rule"]) for r in on_train)
    assert all(not re.search(r"self\.train\b", r["rule"]) or re.search(r"self\.(?!train\b)", r["rule"])
               for r in spec["x-kubernetes-validations"])  # what stays on spec reads some other field of it


def test_every_string_and_list_a_cel_rule_reads_is_bounded():
    """kube-apiserver estimates each rule's worst-case cost from maxLength/maxItems (unbounded ones from the 3 MiB
    request limit) and refuses a CRD whose estimate exceeds its budget; a bounded operand keeps the estimate small.
    Equality costs the smaller operand's size, so a compared object's own fields need no bound of their own."""
    for name, text in render_all().items():
        schema = yaml.safe_load(text)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for path, node in _schema_nodes(schema):
            for rule in node.get("x-kubernetes-validations") or []:
                for operand in _rule_operands(rule["rule"] + " " + rule.get("messageExpression", "")):
                    if operand[:1] == ("metadata",):
                        continue  # ObjectMeta: the API server bounds name and generateName itself
                    read = _at(node, operand)
                    assert read is not None, f"{name} {path}: rule {rule['rule']!r} reads unknown {operand}"
                    if read.get("type") == "string" and "enum" not in read:
                        assert "maxLength" in read, f"{name} {path}.{'.'.join(operand)}: unbounded string in a rule"
                    if read.get("type") == "array":
                        assert "maxItems" in read, f"{name} {path}.{'.'.join(operand)}: unbounded list in a rule"


def test_training_runtimes_are_editable_and_store_only_what_is_written():
    """A runtime's template has no schema defaults (the job's apply after the merge), no immutability rules and
    no status; the cluster-wide one is cluster-scoped."""
    files = render_all()
    for name, scope, short in (("ascendtrainingruntimes", "Namespaced", "atr"),
                               ("clusterascendtrainingruntimes", "Cluster", "catr")):
        crd = yaml.safe_load(files[f"{name}.ascendtrain.dev.yaml"])
        assert crd["spec"]["scope"] == scope and crd["spec"]["names"]["shortNames"] == [short]
        version = crd["spec"]["versions"][0]
        assert "subresources" not in version
        schema = version["schema"]["openAPIV3Schema"]
        assert "status" not in schema["properties"]
        assert not [p for p, node in _schema_nodes(schema) if "default" in node]
        template = schema["properties"]["spec"]["properties"]["template"]["properties"]
        assert {"image", "devices", "hccl", "env", "tolerations", "securityContext", "gangScheduling"} <= set(template)
        assert "oldSelf" not in str(schema)
