"""The local API server's custom-object validation: a node's CEL rules, evaluated together, are judged one by one
as kube-apiserver judges them (the holding ones silent, each failing one with its message, an erroring one as a
rule evaluation error), and list types are enforced also where the compiled validator decides validity."""
from __future__ import annotations

from ascend_operator.local.crd_schema import CustomResourceSchema

SCHEMA = {
    "type": "object",
    "properties": {"spec": {
        "type": "object",
        "x-kubernetes-validations": [
            {"rule": "self.a >= 0", "message": "a must not be negative"},
            {"rule": "self.a < self.b", "messageExpression": "'a ' + string(self.a) + ' must be below b'"},
            {"rule": "self.c.size() > 0", "message": "c must not be empty"},
            {"rule": "self.a == oldSelf.a", "message": "a is immutable"},
        ],
        "properties": {
            "a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "string"},
            "listType": {"type": "string", "enum": ["map"]},  # a property of that name is a property
            "items": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                      "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
        },
    }},
}


def _errors(spec: dict, old: dict | None = None) -> list[str]:
    schema = CustomResourceSchema(SCHEMA)
    return [message for _, message in schema.errors({"spec": spec}, None if old is None else {"spec": old})]


def test_rules_evaluated_together_are_judged_one_by_one():
    assert _errors({"a": 1, "b": 2, "c": "x"}) == []
    assert _errors({"a": -3, "b": 2, "c": "x"}) == ['spec: Invalid value: "object": a must not be negative']
    # c is missing: its rule cannot evaluate, the others are still judged (and b's message is computed)
    found = _errors({"a": 5, "b": 2})
    assert 'spec: Invalid value: "object": a 5 must be below b' in found
    assert any("rule evaluation error: self.c.size() > 0" in m for m in found) and len(found) == 2, found
    # the transition rule only on updates
    assert _errors({"a": 1, "b": 2, "c": "x"}, {"a": 0, "b": 2, "c": "x"}) == [
        'spec: Invalid value: "object": a is immutable']


def test_list_types_and_a_property_named_list_type_are_checked():
    assert _errors({"a": 1, "b": 2, "c": "x", "items": [{"name": "p"}, {"name": "q"}]}) == []
    assert _errors({"a": 1, "b": 2, "c": "x", "items": [{"name": "p"}, {"name": "p"}]}) == [
        'spec.items[1]: Duplicate value: map[string]interface {}{"name":"p"}']
    assert any("listType" in m and "Unsupported value" in m for m in _errors({"a": 1, "b": 2, "c": "x",
                                                                             "listType": "set"}))
