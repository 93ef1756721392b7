"""Load a config from YAML and Megatron-style flags; report errors as ``file:line: field: message``."""
from __future__ import annotations

import argparse
import enum
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from .base import Flag

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file, line and field."""


# ---------------------------------------------------------------- YAML with line numbers

def yaml_lines(node: yaml.Node, path: tuple = (), out: dict | None = None) -> dict[tuple, int]:
    """The 1-based line of every key (and list item) under ``node``, by path: a key's own line, also when its
    value is a mapping that starts on the next line."""
    out = {} if out is None else out
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            out[path + (key.value,)] = key.start_mark.line + 1
            yaml_lines(value, path + (key.value,), out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yaml_lines(item, path + (i,), out)
    return out


def read_yaml(path: str | Path) -> tuple[dict[str, Any], dict[tuple, int]]:
    """Parse a YAML mapping and remember the line of every key (1-based)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config: {e.strerror}") from e
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: invalid YAML: {getattr(e, 'problem', e)}") from e
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}:1: the config must be a mapping, got {type(data).__name__}")
    return data, yaml_lines(node) if node is not None else {}


def format_validation_error(err: ValidationError, source: str, lines: dict[tuple, int] | None = None,
                            prefix: tuple = (), flags: dict[tuple, str] | None = None) -> str:
    """One line per problem: ``job.yaml:12: parallel.tensorModelParallelSize: Input should be ...``; a value
    given by a flag (``flags``: model path -> flag name) is blamed on the flag, not on the file."""
    lines = lines or {}
    out = []
    for e in err.errors():
        flag = next((name for path, name in (flags or {}).items() if tuple(e["loc"])[:len(path)] == path), None)
        loc = tuple(prefix) + tuple(e["loc"])
        line = None
        for n in range(len(loc), -1, -1):  # the deepest key that exists in the file
            if loc[:n] in lines:
                line = lines[loc[:n]]
                break
        where = f"command line {flag}" if flag else f"{source}:{line}" if line else source
        field = ".".join(str(p) for p in loc) or "(root)"
        out.append(f"{where}: {field}: {e['msg'].removeprefix('Value error, ')}")  # pydantic's prefix says nothing
    return "\n".join(out)


# ---------------------------------------------------------------- flags from the model

def _unwrap_optional(tp: Any) -> Any:
    if get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def iter_flag_fields(model: type[BaseModel], path: tuple[str, ...] = ()):
    """Yield (alias path, annotation, Flag) for every flag of every field, walking nested models. A bool field
    may carry two flags that set it opposite ways (``--add-bias-linear`` / ``--disable-bias-linear``)."""
    for name, field in model.model_fields.items():
        alias = field.alias or name
        tp = _unwrap_optional(field.annotation)
        flags = [m for m in field.metadata if isinstance(m, Flag)]
        for flag in flags:
            yield path + (alias,), tp, flag
        if not flags and _is_model(tp):
            yield from iter_flag_fields(tp, path + (alias,))


def _description(model: type[BaseModel], path: tuple[str, ...]) -> str:
    """The field's docstring (its CRD description), first sentence, for --help."""
    field = None
    for alias in path:
        field = next(f for n, f in model.model_fields.items() if (f.alias or n) == alias)
        inner = _unwrap_optional(field.annotation)
        model = inner if _is_model(inner) else model
    text = " ".join((field.description or "").split()) if field else ""
    # argparse %-formats help strings: a docstring's own % must stay literal
    return _first_sentence(text).rstrip(".").replace("%", "%%") if text else ".".join(path)


_NOT_A_SENTENCE_END = re.compile(r"(?:\be\.g|\bi\.e|\betc|\bvs|\bcf)\.$")


def _first_sentence(text: str) -> str:
    """Up to the first ". " that ends a sentence ("e.g. " and "i.e. " do not)."""
    start = 0
    while (end := text.find(". ", start)) != -1:
        if not _NOT_A_SENTENCE_END.search(text[:end + 1]):
            return text[:end]
        start = end + 2
    return text


def _default(model: type[BaseModel], path: tuple[str, ...]) -> str:
    """`` (default: X)`` for --help, from the model (argparse's own default stays unset, so that only the flags
    given override a config file); empty for required fields and unset optionals."""
    field = None
    for alias in path:
        field = next(f for n, f in model.model_fields.items() if (f.alias or n) == alias)
        inner = _unwrap_optional(field.annotation)
        model = inner if _is_model(inner) else model
    if field is None or field.is_required() or field.default in (None, [], {}):
        return ""
    value = field.default.value if isinstance(field.default, enum.Enum) else field.default
    return f" (default: {value})".replace("%", "%%")


def add_flags(parser: argparse.ArgumentParser, model: type[BaseModel]) -> dict[str, tuple[str, ...]]:
    """Add one argparse option per flagged field; return dest -> alias path."""
    dests: dict[str, tuple[str, ...]] = {}
    for path, tp, flag in iter_flag_fields(model):
        dest = "cfg__" + "__".join(path)
        kwargs: dict[str, Any] = {"dest": dest, "default": argparse.SUPPRESS,
                                  "help": f"{flag.help or _description(model, path)} [{'.'.join(path)}]"
                                          f"{_default(model, path)}"}
        if flag.invert:
            kwargs["help"] = f"turn off: {kwargs['help']}"
        origin = get_origin(tp)
        if tp is bool:
            kwargs["action"] = "store_false" if flag.invert else "store_true"
        elif origin in (list, tuple):
            kwargs["nargs"] = "+"
            inner = get_args(tp)[0] if get_args(tp) else str
            if get_origin(inner) is Literal:
                kwargs["choices"] = list(get_args(inner))
        elif origin is Literal:
            kwargs["choices"] = list(get_args(tp))
        elif isinstance(tp, type) and issubclass(tp, enum.Enum):
            kwargs["choices"] = [m.value for m in tp]
        if tp is not bool and "choices" not in kwargs:
            kwargs["metavar"] = flag.names[0].lstrip("-").replace("-", "_").upper()
        parser.add_argument(*flag.names, **kwargs)
        dests[dest] = path
    return dests


def _set_path(data: dict, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        data = data.setdefault(key, {})
    data[path[-1]] = value


def build_config(model: type[M], args: argparse.Namespace, dests: dict[str, tuple[str, ...]],
                 config_path: str | None = None, section: str | None = None) -> M:
    """YAML file (if any) first, flags on top, then one validation with errors that name file and line.

    ``section`` lets the engine read a whole custom resource (``spec.train``) as well as a bare config.
    """
    data: dict[str, Any] = {}
    lines: dict[tuple, int] = {}
    prefix: tuple = ()
    source = config_path or "command line"
    if config_path:
        data, lines = read_yaml(config_path)
        if section and "apiVersion" in data and "kind" in data:
            spec = data.get("spec") or {}
            if section not in spec:
                raise ConfigError(f"{config_path}: {data['kind']} has no spec.{section}")
            prefix = ("spec", section)
            data = spec[section] or {}
    flag_names = {path: flag.names[0] for path, _, flag in iter_flag_fields(model)}
    given: dict[tuple, str] = {}
    for dest, path in dests.items():
        if hasattr(args, dest):
            _set_path(data, path, getattr(args, dest))
            given[path] = flag_names.get(path, dest)
    try:
        # a plain engine file never met a Kubernetes API server: its errors do not speak of one
        return model.model_validate(data, context={"kubernetes": bool(prefix)})
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source, lines, prefix, given)) from None
