"""A CRD version's openAPIV3Schema applied the way the API server applies it to custom objects.

Order as on a real server: prune unknown fields (structural schemas), drop nulls the schema does not allow,
apply ``default``s, then validate with the OpenAPI schema and with the CEL rules
(``x-kubernetes-validations``, ``self`` bound to the value at the rule's level, ``oldSelf`` on updates; at the
root ``self.metadata`` holds only ``name`` and ``generateName``). Schema errors come first; when one of them
means the object lacks the shape the rules were written for (a wrong type, a missing required field, a value
outside an enum, too long, too many items) the CEL rules are not evaluated at all, as in kube-apiserver's
``hasBlockingErr``. On updates CEL rules are ratcheted as on kube-apiserver 1.30+: a subtree the update left
unchanged is not judged again (a status patch does not re-run the spec's rules). Programs are compiled once per
expression and process, by cel-cpp (the C++ implementation kube-apiserver's cel-go is held to by the same
conformance suite) with the strings extension, and type-checked against dynamic ``self``/``oldSelf``: a rule
that does not parse or names an unknown function fails when the CRD is written.
The schema is checked by ``jsonschema-rs`` first (compiled: microseconds); only an object it finds invalid is
walked by ``jsonschema`` for the errors, so the answers are ``jsonschema``'s.
Errors come back in the API server's wording: ``spec.nnodes: Invalid value: 0: ...``.
"""
from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import jsonschema_rs
from cel_expr_python import cel
from cel_expr_python.ext import ext_strings

_ROOT_KEPT = ("apiVersion", "kind", "metadata")
# jsonschema validators whose failure kube-apiserver counts as blocking CEL (NotSupported, Required, TooLong,
# TooMany, TypeInvalid).
_BLOCKING = {"enum", "required", "maxLength", "maxItems", "maxProperties", "type"}
RULES_NOT_CHECKED = ("<nil>", '<nil>: Invalid value: "null": some validation rules were not checked because the '
                              "object was invalid; correct the existing errors to complete validation")


_CEL = cel.NewEnv(variables={"self": cel.Type.DYN, "oldSelf": cel.Type.DYN}, extensions=[ext_strings.ExtStrings()])
_PROGRAMS: dict[str, Any] = {}


def _field(path: list[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def _quoted(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _type_name(value: Any) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string" if isinstance(value, str) else "null"


def _rule_error(field: str, type_name: str, message: str, reason: str | None) -> str:
    """A failed CEL rule in kube-apiserver's words, which depend on the rule's ``reason``."""
    if reason == "FieldValueForbidden":
        return f"{field}: Forbidden: {message}"
    if reason == "FieldValueRequired":
        return f"{field}: Required value: {message}"
    return f'{field}: Invalid value: "{type_name}": {message}'


def _to_jsonschema(schema: Any) -> Any:
    """OpenAPI v3.0 -> JSON Schema draft 4: ``nullable: true`` becomes a ``null`` type; x-kubernetes-* are ignored."""
    if isinstance(schema, list):
        return [_to_jsonschema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _to_jsonschema(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if schema.get("x-kubernetes-list-type") in ("map", "set"):
        out["listType"] = [schema["x-kubernetes-list-type"], schema.get("x-kubernetes-list-map-keys") or []]
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if schema.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    out.pop("nullable", None)
    return out


def _go_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    """``pattern`` as kube-apiserver matches it (Go's RE2): ``$`` is the end of the text, not "before a final
    newline" as in Python, and ``\\w``, ``\\d``, ``\\s`` are ASCII."""
    if isinstance(instance, str) and not re.search(re.sub(r"(?<!\\)\$", r"\\Z", pattern), instance, re.ASCII):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _list_type(validator: Any, list_type: list[Any], instance: Any, schema: Any) -> Any:
    """``x-kubernetes-list-type: map | set``: no two items with the same keys (map) or the same value (set)."""
    if not isinstance(instance, list):
        return
    kind, keys = list_type
    seen: list[Any] = []
    for index, item in enumerate(instance):
        key = {k: item.get(k) for k in keys} if kind == "map" and isinstance(item, dict) else item
        if key in seen:
            if kind == "map":
                shown = ", ".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in key.items())
                words = f"map[string]interface {{}}{{{shown}}}"
            else:
                words = json.dumps(item)
            yield jsonschema.ValidationError(f"Duplicate value: {words}", path=[index], validator="duplicate")
        seen.append(key)


_Validator = jsonschema.validators.extend(jsonschema.Draft4Validator, {"pattern": _go_pattern,
                                                                       "listType": _list_type})


def _without_list_types(schema: Any) -> Any:
    """The schema without its ``listType`` keywords (a property of that name stays)."""
    if isinstance(schema, list):
        return [_without_list_types(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _without_list_types(v) for k, v in schema.items() if k not in ("listType", "properties")}
    if "properties" in schema:
        out["properties"] = {k: _without_list_types(v) for k, v in schema["properties"].items()}
    return out


def _list_type_skeleton(schema: Any) -> dict[str, Any] | None:
    """The parts of a schema that lead to a ``listType`` (properties, items, additionalProperties), None where
    none does: what the list-type check has to walk of an object."""
    if not isinstance(schema, dict):
        return None
    out: dict[str, Any] = {}
    if "listType" in schema:
        out["listType"] = schema["listType"]
    properties = {k: sub for k, v in (schema.get("properties") or {}).items()
                  if (sub := _list_type_skeleton(v)) is not None}
    if properties:
        out["properties"] = properties
    for key in ("items", "additionalProperties"):
        if (sub := _list_type_skeleton(schema.get(key))) is not None:
            out[key] = sub
    return out or None


def _has_duplicates(skeleton: dict[str, Any], value: Any) -> bool:
    if isinstance(value, list):
        if "listType" in skeleton and next(_list_type(None, skeleton["listType"], value, None), None) is not None:
            return True
        return "items" in skeleton and any(_has_duplicates(skeleton["items"], item) for item in value)
    if isinstance(value, dict):
        properties = skeleton.get("properties") or {}
        if any(key in value and _has_duplicates(sub, value[key]) for key, sub in properties.items()):
            return True
        extra = skeleton.get("additionalProperties")
        return extra is not None and any(_has_duplicates(extra, v) for k, v in value.items() if k not in properties)
    return False


class _Draft4:
    """``iter_errors`` of the Draft 4 validator above, walked only when the compiled one (jsonschema-rs, given the
    schema without ``listType``, which it does not know) or the walk of the list-typed lists finds an error."""

    def __init__(self, schema: dict[str, Any]):
        # formats: as jsonschema's
        self._quick = jsonschema_rs.Draft4Validator(_without_list_types(schema), validate_formats=False)
        self._lists = _list_type_skeleton(schema)
        self._full = _Validator(schema)

    def iter_errors(self, value: Any) -> list[jsonschema.ValidationError]:
        if self._quick.is_valid(value) and (self._lists is None or not _has_duplicates(self._lists, value)):
            return []
        return list(self._full.iter_errors(value))


class _Activation:
    """``self`` and ``oldSelf`` of one schema node for all its rules, ``oldSelf`` only for rules that use it."""

    def __init__(self, value: Any, old: Any):
        self.value, self.old = value, old

    def bindings(self, with_old: bool) -> dict[str, Any]:
        out = {"self": self.value}
        if with_old and self.old is not None:
            out["oldSelf"] = self.old
        return out


_SCALARS = (str, int, float, bool, type(None))
_JSON_INT_MAX = 2 ** 53 - 1  # the largest float kube-apiserver's schema validation takes for an integer
_NO_PROPERTIES: dict[str, Any] = {}


def _spelled(path: tuple) -> list[str | int]:
    """A linked path ``(((), "spec"), "train")`` as a list: ``["spec", "train"]``."""
    parts: list[str | int] = []
    while path:
        path, key = path
        parts.append(key)
    return parts[::-1]


def _json_copy(value: Any) -> Any:
    """A copy of JSON data (dicts, lists and immutable scalars): what ``copy.deepcopy`` gives, in a fraction of
    its time (no memo, no dispatch per scalar)."""
    if type(value) is dict:
        return {k: _json_copy(v) for k, v in value.items()}
    if type(value) is list:
        return [_json_copy(v) for v in value]
    return value


class CustomResourceSchema:
    """Prune, default and validate custom objects of one CRD version."""

    def __init__(self, open_api_v3_schema: dict[str, Any]):
        self.schema = open_api_v3_schema or {}
        self._validator = _Draft4(_to_jsonschema(self.schema))
        # One validator per top-level property (spec, status): an update validates only the parts it changed.
        self._parts = {key: _Draft4(_to_jsonschema(sub)) for key, sub in (self.schema.get("properties") or {}).items()}
        # Compile every rule now, so a bad rule fails when the CRD is created (as on a real server), noting the
        # schema nodes with rules at or below them: a walk of an object skips the parts no rule looks at.
        self._ruled: set[int] = set()
        self._compile_all(self.schema)
        self._defaults: dict[int, list[tuple[str, dict[str, Any]]]] = {}  # schema node id -> its defaulted keys

    def _compile_all(self, schema: Any) -> bool:
        if not isinstance(schema, dict):
            return False
        ruled = False
        for rule in schema.get("x-kubernetes-validations") or []:
            self._program(rule["rule"])
            if rule.get("messageExpression"):
                self._program(rule["messageExpression"])
            ruled = True
        below = [*(schema.get("properties") or {}).values(), schema.get("items"), schema.get("additionalProperties")]
        ruled = any([self._compile_all(sub) for sub in below]) or ruled  # (a list: every node is walked)
        if ruled:
            self._ruled.add(id(schema))
        return ruled

    @staticmethod
    def _program(expression: str) -> Any:
        """The compiled CEL program of one expression, compiled once per process (a CRD written again, or another
        version of it, reuses it)."""
        if expression not in _PROGRAMS:
            _PROGRAMS[expression] = _CEL.compile(expression)
        return _PROGRAMS[expression]

    # -- shaping ----------------------------------------------------------------------------------

    def prepare(self, obj: dict[str, Any], pruned: list[str] | None = None,
                stored: dict[str, Any] | None = None) -> dict[str, Any]:
        """Pruned and defaulted copy of ``obj`` (apiVersion, kind and metadata are kept at the root); the paths of
        pruned unknown fields are appended to ``pruned`` (``spec.train.foo``, ``spec.volumes[0].bar``).

        A top-level part that is the very object of ``stored`` (the stored object, already pruned and defaulted
        by this schema: a status write carries the spec over) is kept as it is: shaping it again changes nothing."""
        kept = {k: obj[k] for k in _ROOT_KEPT if k in obj}
        same = {k: v for k, v in obj.items() if k not in _ROOT_KEPT and stored is not None and stored.get(k) is v}
        rest = self._shape({k: v for k, v in obj.items() if k not in _ROOT_KEPT and k not in same}, self.schema, (),
                           pruned)
        return {**kept, **rest, **same}

    def _shape(self, value: Any, schema: dict[str, Any], path: tuple | None = None,
               pruned: list[str] | None = None) -> Any:
        """The structural-schema walk: unknown fields pruned, disallowed nulls dropped, defaults filled, and the
        result a copy. ``path`` is linked, ``(parent, key)``, and spelled out only for a pruned field."""
        kind = type(value)
        if kind is dict:
            props = schema.get("properties") or _NO_PROPERTIES
            out: dict[str, Any] = {}
            for key, item in value.items():
                sub = props.get(key)
                if sub is None:
                    extra = schema.get("additionalProperties")
                    if isinstance(extra, dict):
                        sub = extra
                    elif extra is True or schema.get("x-kubernetes-preserve-unknown-fields", False):
                        out[key] = _json_copy(item)
                        continue
                    else:
                        if pruned is not None and path is not None:
                            pruned.append(_field(_spelled((path, key))))
                        continue  # pruned: unknown field of a structural schema
                if item is None and not sub.get("nullable"):
                    continue  # a null the schema does not allow is dropped (and may be defaulted below)
                out[key] = self._shape(item, sub, None if path is None else (path, key), pruned)
            for key, sub in self._defaulted(schema):
                if key not in out:
                    out[key] = self._shape(sub["default"], sub)  # shaping copies: the schema's default stays apart
            return out
        if kind is list and isinstance(schema.get("items"), dict):
            items = schema["items"]
            return [self._shape(item, items, None if path is None else (path, i), pruned)
                    for i, item in enumerate(value)]
        if kind is float and schema.get("type") == "integer" and value.is_integer() and abs(value) <= _JSON_INT_MAX:
            return int(value)  # 2.0 is an integer to kube-apiserver (swag.IsFloat64AJSONInteger), stored as 2
        return value if kind in _SCALARS else _json_copy(value)

    def _defaulted(self, schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """The properties of a schema node that have a default (looked up once per node)."""
        found = self._defaults.get(id(schema))
        if found is None:
            found = self._defaults[id(schema)] = [(k, sub) for k, sub in (schema.get("properties") or {}).items()
                                                  if "default" in sub]
        return found

    # -- validation -------------------------------------------------------------------------------

    def errors(self, obj: dict[str, Any], old: dict[str, Any] | None = None,
               every_rule: bool = False) -> list[tuple[str, str]]:
        """``(field, message)`` pairs, empty when ``obj`` is valid.

        Like kube-apiserver, CEL rules are skipped after a blocking schema error. ``every_rule`` (offline
        validation, which wants every problem at once) evaluates them anyway and keeps the rules that fail
        cleanly, dropping those that cannot evaluate on the ill-typed values already reported."""
        body = {k: v for k, v in obj.items() if k not in _ROOT_KEPT}
        old_body = None if old is None else {k: v for k, v in old.items() if k not in _ROOT_KEPT}
        schema_errors = self._schema_errors(body, old_body)
        found = sorted({self._schema_error(e) for e in schema_errors})
        blocked = any(e.validator in _BLOCKING for e in schema_errors)
        if blocked and not every_rule:
            return found + [RULES_NOT_CHECKED]
        rule_errors: list[tuple[str, str]] = []
        self._rule_errors(self._with_name(body, obj), old_body and self._with_name(old_body, old), self.schema, [],
                          rule_errors)
        if blocked:
            rule_errors = [(f, m) for f, m in rule_errors if "rule evaluation error" not in m]
        return found + sorted(set(rule_errors))

    def _schema_errors(self, body: dict[str, Any], old_body: dict[str, Any] | None) -> list[Any]:
        """OpenAPI schema errors; on an update, ratcheted like the CEL rules: a top-level part (spec, status) the
        update left unchanged is not validated again."""
        if old_body is None or any(key not in body for key in self.schema.get("required") or []):
            return list(self._validator.iter_errors(body))
        found = []
        for key, value in body.items():
            if key in self._parts and old_body.get(key) != value:
                for error in self._parts[key].iter_errors(value):
                    error.path.appendleft(key)
                    found.append(error)
        return found

    @staticmethod
    def _with_name(body: dict[str, Any], obj: dict[str, Any]) -> dict[str, Any]:
        """The root as CEL sees it: the body plus ``metadata.name`` / ``metadata.generateName``."""
        meta = obj.get("metadata") or {}
        return {**body, "metadata": {k: meta[k] for k in ("name", "generateName") if k in meta}}

    @staticmethod
    def _schema_error(error: jsonschema.ValidationError) -> tuple[str, str]:
        path = list(error.absolute_path)
        field, value, kind = _field(path), error.instance, error.validator
        if kind == "required":
            missing = [r for r in error.validator_value if not isinstance(value, dict) or r not in value]
            field = _field(path + missing[:1])
            return field, f"{field}: Required value"
        if kind == "duplicate":
            return field, f"{field}: {error.message}"
        if kind == "enum":
            allowed = ", ".join(_quoted(v) for v in error.validator_value)
            return field, f"{field}: Unsupported value: {_quoted(value)}: supported values: {allowed}"
        if kind == "type":
            return field, (f'{field}: Invalid value: "{_type_name(value)}": {field} in body must be of type '
                           f"{error.validator_value}: {_quoted(value)}")
        words = {
            "minimum": "should be greater than or equal to", "maximum": "should be less than or equal to",
            "minLength": "should be at least {} chars long", "maxLength": "may not be longer than {}",
            "minItems": "should have at least {} items", "maxItems": "must have at most {} items",
            "pattern": "should match '{}'",
            "minProperties": "should have at least {} properties", "maxProperties": "should have at most {} properties",
        }
        if kind in ("minProperties", "maxProperties") and isinstance(value, dict):
            value = len(value)  # kube-apiserver shows the count
        if kind in words:
            text = words[kind]
            text = text.format(error.validator_value) if "{}" in text else f"{text} {error.validator_value}"
            return field, f"{field}: Invalid value: {_quoted(value)}: {field} in body {text}"
        return field, f"{field}: Invalid value: {_quoted(value)}: {error.message}"

    def _rule_errors(self, value: Any, old: Any, schema: Any, path: list[str | int],
                     found: list[tuple[str, str]]) -> None:
        if not isinstance(schema, dict) or value is None:
            return
        if old is not None and value == old:
            # Validation ratcheting (CRDValidationRatcheting, on by default since 1.30): an update does not re-judge
            # a value it left unchanged, so a status patch never re-runs the spec's rules.
            return
        if id(schema) not in self._ruled:
            return
        rules = [rule for rule in schema.get("x-kubernetes-validations") or []
                 if old is not None or "oldSelf" not in rule["rule"]]  # transition rules: updates only
        converted = _Activation(value, old)
        for rule in self._failing(rules, converted):
            message = self._check_rule(rule, converted)
            if message is not None:
                field = (_field(path) if path else "") + (rule.get("fieldPath") or "")
                field = field.lstrip(".") or _field(path)
                found.append((field, _rule_error(field, _type_name(value), message, rule.get("reason"))))
        if isinstance(value, dict):
            props = schema.get("properties") or {}
            extra = schema.get("additionalProperties")
            for key, item in value.items():
                sub = props.get(key, extra if isinstance(extra, dict) else None)
                old_item = old.get(key) if isinstance(old, dict) else None
                self._rule_errors(item, old_item, sub, path + [key], found)
        elif isinstance(value, list):
            # Differs from a real server: oldSelf is not correlated inside lists (only map-type lists are there).
            for index, item in enumerate(value):
                self._rule_errors(item, None, schema.get("items"), path + [index], found)

    def _failing(self, rules: list[dict[str, Any]], converted: _Activation) -> list[dict[str, Any]]:
        """The rules that may not hold, found by one evaluation of all of a node's rules as one CEL list (the
        value is converted for CEL once, not once a rule); when that list does not evaluate (a rule's error), every
        rule is judged on its own."""
        if len(rules) < 2:
            return rules
        together = "[" + ", ".join(f"({rule['rule']})" for rule in rules) + "]"
        uses_old = any("oldSelf" in rule["rule"] or "oldSelf" in (rule.get("messageExpression") or "")
                       for rule in rules)
        result = self._program(together).eval(data=converted.bindings(uses_old))
        if result.type() == cel.Type.ERROR:
            return rules
        return [rule for rule, held in zip(rules, result.value()) if held.value() is not True]

    def _check_rule(self, rule: dict[str, Any], converted: _Activation) -> str | None:
        """The failure message of one CEL rule, or None when it holds (or is a transition rule on create)."""
        expression = rule["rule"]
        uses_old = "oldSelf" in expression or "oldSelf" in (rule.get("messageExpression") or "")
        if "oldSelf" in expression and converted.old is None:
            return None
        activation = converted.bindings(uses_old)
        result = self._program(expression).eval(data=activation)
        if result.type() == cel.Type.ERROR:
            return f"rule evaluation error: {expression}: {result.value()}"
        if result.value() is True:
            return None
        if rule.get("messageExpression"):
            message = self._program(rule["messageExpression"]).eval(data=activation)
            if message.type() == cel.Type.STRING:
                return str(message.value())
        return rule.get("message") or f"failed rule: {expression}"
