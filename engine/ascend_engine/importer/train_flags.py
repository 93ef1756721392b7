"""Map a launch's training flags onto ``TrainConfig`` through the train command's own parser (or an evaluation
script's onto ``EvaluateConfig`` through the evaluate command's).

The parser is the one ``ascend-engine train`` uses (``train.command.add_arguments``: one option per
``Flag`` from ``iter_flag_fields``, plus its aliases such as ``--bf16``), so a field added to the models is
imported without a change here. Each flag is parsed on its own so that every flag is either mapped to a YAML
path or reported with the reason it was not.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from ..config.loader import add_flags
from ..config.train import TrainConfig
from ..train.command import add_arguments
from .accelerations import has_no_effect

_DEST_PREFIX = "cfg__"


@dataclass
class Skipped:
    flag: str
    values: list[str]
    reason: str

    def __str__(self) -> str:
        shown = " ".join([self.flag, *self.values])
        return f"{shown}: {self.reason}"


@dataclass
class MappedFlags:
    data: dict[str, Any] = field(default_factory=dict)     # nested YAML of TrainConfig
    mapped: dict[tuple[str, ...], str] = field(default_factory=dict)  # YAML path -> flag that set it
    skipped: list[Skipped] = field(default_factory=list)
    no_effect: list[str] = field(default_factory=list)  # acceleration switches (accelerations.py), as written


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would exit; the importer reports instead
        raise argparse.ArgumentError(None, message)


def train_parser() -> argparse.ArgumentParser:
    parser = _RaisingParser(prog="train", allow_abbrev=False, exit_on_error=False, add_help=False)
    add_arguments(parser)
    return parser


def model_parser(model: type[BaseModel]) -> argparse.ArgumentParser:
    """One option per flagged field of ``model``, as its command adds them."""
    parser = _RaisingParser(prog=model.__name__, allow_abbrev=False, exit_on_error=False, add_help=False)
    add_flags(parser, model)
    return parser


def _set(data: dict, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        data = data.setdefault(key, {})
    data[path[-1]] = value


def _unset(data: dict, path: tuple[str, ...]) -> None:
    for key in path[:-1]:
        data = data.get(key, {})
    data.pop(path[-1], None)


def map_flags(flags: list[tuple[str, list[str]]], model: type[BaseModel] = TrainConfig) -> MappedFlags:
    parser = train_parser() if model is TrainConfig else model_parser(model)
    out = MappedFlags()
    for flag, values in flags:
        if has_no_effect(flag):
            out.no_effect.append(" ".join([flag, *values]))
            continue
        try:
            ns, rest = parser.parse_known_args([flag, *values])
        except argparse.ArgumentError as e:
            out.skipped.append(Skipped(flag, values, f"invalid value ({e.message})"))
            continue
        dests = {k: v for k, v in vars(ns).items() if k.startswith(_DEST_PREFIX)}
        if not dests:
            out.skipped.append(Skipped(flag, values, f"no {model.__name__} field takes this flag"))
            continue
        for dest, value in dests.items():
            path = tuple(dest[len(_DEST_PREFIX):].split("__"))
            _set(out.data, path, value)
            out.mapped[path] = flag
        if rest:
            out.skipped.append(Skipped(flag, rest, f"extra values after {flag}"))
    _drop_invalid(out, model)
    return out


def _drop_invalid(out: MappedFlags, model: type[BaseModel]) -> None:
    """Validate field by field: a value the model rejects is reported against its flag and left out."""
    for _ in range(len(out.mapped) + 1):
        try:
            model.model_validate(out.data)
            return
        except ValidationError as e:
            attributable = []
            for err in e.errors():
                loc = tuple(str(p) for p in err["loc"])
                path = next((p for p in out.mapped if loc[:len(p)] == p), None)
                if path is not None:
                    attributable.append((path, err["msg"]))
            if not attributable:
                return  # a cross-field rule: the caller reports it with the whole config
            for path, message in attributable:
                if path in out.mapped:
                    flag = out.mapped.pop(path)
                    value = _get(out.data, path)
                    _unset(out.data, path)
                    shown = value if isinstance(value, list) else [str(value)]
                    out.skipped.append(Skipped(flag, shown, f"{'.'.join(path)}: {message}"))


def _get(data: dict, path: tuple[str, ...]) -> Any:
    for key in path:
        data = data[key]
    return data
