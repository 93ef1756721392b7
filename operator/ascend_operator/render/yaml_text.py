"""``yaml.safe_dump(data, sort_keys=False)``, the same text at a fraction of the CPU: every job's ConfigMap holds
its engine config as YAML (about 200 nodes), and a burst of job creations spent a fifth of the operator's CPU in
PyYAML's representer.

PyYAML's dump is three stages: the representer turns the data into a node graph (pure Python, a dozen calls a
node), the serializer decides each scalar's implicit tags (the resolver's regular expressions, twice a scalar),
and the emitter writes text (libyaml's, where PyYAML was built with it). Here the graph is built by one small
function with SafeRepresenter's own rules for the plain JSON types (the same tags and values; a dict or list met
twice becomes the same node, hence the same anchor and alias), the resolver's answers are remembered per scalar
(SafeDumper has no path resolvers, so the answer depends on the value alone), and the emitter is PyYAML's. Data
with any other type goes through ``yaml.dump`` unchanged. ``tests/unit/test_yaml_text.py`` holds the two to the
same bytes.
"""
from __future__ import annotations

import io
from functools import lru_cache
from typing import Any

import yaml
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

_BASE = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's emitter where PyYAML was built with it
_TAG = "tag:yaml.org,2002:"
_FLOATS = yaml.representer.SafeRepresenter()  # .nan, .inf, 1.0e+20: the representer's own spelling of floats


class _Dumper(_BASE):  # type: ignore[misc, valid-type]
    """The base dumper with the resolver's implicit-tag answers remembered (the serializer asks twice a scalar)."""

    @staticmethod
    @lru_cache(maxsize=8192)
    def _resolve_scalar(value: str, implicit: tuple[bool, bool]) -> str:
        return _BASE.resolve(_RESOLVER, ScalarNode, value, implicit)

    def resolve(self, kind: type, value: Any, implicit: Any) -> str:
        if kind is ScalarNode and not self.yaml_path_resolvers:
            return self._resolve_scalar(value, tuple(implicit))
        return super().resolve(kind, value, implicit)


_RESOLVER = _BASE(io.StringIO())  # resolve() reads only the class's resolvers; this instance never writes


class _Other(Exception):
    """A type the fast path does not represent: dump it the ordinary way."""


def _node(data: Any, seen: dict[int, Any]) -> Any:
    kind = type(data)
    if kind is str:
        return ScalarNode(_TAG + "str", data)
    if kind is bool:
        return ScalarNode(_TAG + "bool", "true" if data else "false")
    if kind is int:
        return ScalarNode(_TAG + "int", str(data))
    if data is None:
        return ScalarNode(_TAG + "null", "null")
    if kind is float:
        return _FLOATS.represent_float(data)
    if kind is dict or kind is list:
        if id(data) in seen:
            return seen[id(data)]
        if kind is dict:
            node = seen[id(data)] = MappingNode(_TAG + "map", [], flow_style=False)
            node.value = [(_node(k, seen), _node(v, seen)) for k, v in data.items()]
        else:
            node = seen[id(data)] = SequenceNode(_TAG + "seq", [], flow_style=False)
            node.value = [_node(v, seen) for v in data]
        return node
    raise _Other(kind)


def dump(data: Any) -> str:
    """The text of ``yaml.dump(data, Dumper=CSafeDumper, sort_keys=False)``."""
    try:
        node = _node(data, {})
    except _Other:
        return yaml.dump(data, Dumper=_BASE, sort_keys=False)
    stream = io.StringIO()
    dumper = _Dumper(stream, default_flow_style=False, sort_keys=False)
    try:
        dumper.open()
        dumper.serialize(node)
        dumper.close()
    finally:
        dumper.dispose()
    return stream.getvalue()
