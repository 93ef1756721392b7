"""``ascend-engine evaluate --task mmlu --task-data-path data/test --load CKPT --tokenizer-name-or-path TOK``,
under torchrun with TP x PP processes (MindSpeed-LLM's evaluation flags)."""
from __future__ import annotations

import argparse
import sys

from ..config.evaluate import EvaluateConfig
from ..config.loader import add_flags, build_config

_DESTS: dict[str, tuple[str, ...]] = {}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="EvaluateConfig YAML, or an AscendTrainJob (its spec.evaluation)")
    _DESTS.update(add_flags(parser, EvaluateConfig))


def run(args: argparse.Namespace) -> int:
    cfg = build_config(EvaluateConfig, args, _DESTS, args.config, section="evaluation")
    from ..checkpoint.training import CheckpointMismatch
    from ..convert.torch_file import CheckpointFileError
    from .questions import TaskDataError
    from .runner import evaluate

    try:
        evaluate(cfg)
    except TaskDataError as e:
        print(f"ascend-engine evaluate: bad task data: {e}", file=sys.stderr)
        return 2
    except (CheckpointMismatch, CheckpointFileError) as e:
        print(f"ascend-engine evaluate: cannot load checkpoint: {e}", file=sys.stderr)
        return 2
    return 0
