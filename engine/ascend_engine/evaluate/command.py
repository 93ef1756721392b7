"""``ascend-engine evaluate --task mmlu --task-data-path data/test --load CKPT --tokenizer-name-or-path TOK``,
under torchrun with TP x PP processes (MindSpeed-LLM's evaluation flags)."""
from __future__ import annotations

import argparse
import sys
import time

from ..config.evaluate import EvaluateConfig
from ..config.loader import ConfigError, add_flags, build_config

_DESTS: dict[str, tuple[str, ...]] = {}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="EvaluateConfig YAML, or an AscendTrainJob (its spec.evaluation)")
    _DESTS.update(add_flags(parser, EvaluateConfig))


def run(args: argparse.Namespace) -> int:
    cfg = build_config(EvaluateConfig, args, _DESTS, args.config, section="evaluation")
    from .questions import TaskDataError
    from .sandbox import SandboxUnavailable

    if cfg.completions:
        from .completions import score_completions

        try:
            score_completions(cfg)
        except TaskDataError as e:
            return _failed(f"bad task data: {e}")
        except SandboxUnavailable as e:
            return _failed(str(e))
        return 0
    if not cfg.load:
        raise ConfigError(f"{args.config or 'command line'}: load: a checkpoint to evaluate is required (--load)")
    from ..telemetry import say

    say("evaluate", "importing torch", time.perf_counter())
    from ..checkpoint.training import CheckpointMismatch
    from ..convert.torch_file import CheckpointFileError
    from .runner import evaluate

    try:
        evaluate(cfg)
    except TaskDataError as e:
        return _failed(f"bad task data: {e}")
    except SandboxUnavailable as e:
        return _failed(str(e))
    except (CheckpointMismatch, CheckpointFileError) as e:
        return _failed(f"cannot load checkpoint: {e}")
    return 0


def _failed(message: str) -> int:
    """Say why on stderr and in the termination message (the job's Failed condition quotes it)."""
    from ..telemetry import report_result

    print(f"ascend-engine evaluate: {message}", file=sys.stderr)
    report_result({"reason": "EvaluationFailed", "message": message[:3000]})
    return 2
