"""MindSpeed-LLM's tool scripts in a launch script: ``convert_ckpt*.py`` becomes a CheckpointConvert,
``preprocess_data.py`` a DatasetPrep. Their flags are the engine's own (``ascend-engine convert`` /
``preprocess`` take the same names), so they are parsed by the same models; a flag no field takes is named."""
from __future__ import annotations

import argparse
import os
import re
from typing import Any

from pydantic import ValidationError

from ..config.convert import ConvertConfig
from ..config.loader import ConfigError, add_flags, build_config, format_validation_error
from ..config.prep import PrepConfig
from .launch import group_flags
from .shell import Command

_TOOLS = {  # script name pattern -> (kind, spec section, engine model)
    re.compile(r"convert_ckpt[\w.-]*\.py"): ("CheckpointConvert", "convert", ConvertConfig),
    re.compile(r"preprocess_data\.py"): ("DatasetPrep", "prep", PrepConfig),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # noqa: D102 (argparse's hook): an error, not an exit
        raise ConfigError(message)


def tool_of(command: Command) -> tuple[str, str, type] | None:
    """(kind, section, model) when the command runs one of the tools with python."""
    words = command.words
    if len(words) < 2 or not os.path.basename(words[0]).startswith("python"):
        return None
    script = os.path.basename(words[1])
    return next((tool for pattern, tool in _TOOLS.items() if pattern.fullmatch(script)), None)


def import_tool(command: Command, source: str, name: str, image: str) -> tuple[dict[str, Any], list[str]]:
    """The resource for one tool command, and the flags it did not take (``--flag value: reason``)."""
    from ascend_operator.api.group import API_GROUP, API_VERSION  # the kinds' names live next to the CRDs
    from ascend_operator.api.single_pod import CheckpointConvertSpec, DatasetPrepSpec

    kind, section, model = tool_of(command)
    parser = _Parser(add_help=False, allow_abbrev=False)
    dests = add_flags(parser, model)
    args, extra = parser.parse_known_args(command.words[2:])
    _, groups = group_flags(extra)
    skipped = [f"{flag} {' '.join(values)}".strip() + f": no {model.__name__} field takes this flag"
               for flag, values in groups]
    where = f"{source}:{command.line}"
    config = build_config(model, args, dests).model_dump(mode="json", by_alias=True, exclude_unset=True)
    spec = {"image": image, section: config}
    spec_model = CheckpointConvertSpec if kind == "CheckpointConvert" else DatasetPrepSpec
    try:
        spec_model.model_validate(spec)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, where, prefix=("spec",))) from None
    manifest = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": kind, "metadata": {"name": name}, "spec": spec}
    return manifest, skipped
