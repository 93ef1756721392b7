"""``ascend-engine train --config job.yaml [Megatron flags]``: run under torchrun on every pod."""
from __future__ import annotations

import argparse
import os
import sys
import time

from ..config.loader import ConfigError, add_flags, build_config
from ..config.train import TrainConfig

_DESTS: dict[str, tuple[str, ...]] = {}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="TrainConfig YAML, or a whole AscendTrainJob manifest (spec.train)")
    _DESTS.update(add_flags(parser, TrainConfig))
    precision = "cfg__training__precision"
    parser.add_argument("--bf16", dest=precision, action="store_const", const="bf16", default=argparse.SUPPRESS,
                        help="same as --precision bf16")
    parser.add_argument("--fp16", dest=precision, action="store_const", const="fp16", default=argparse.SUPPRESS,
                        help="same as --precision fp16")


def load_config(args: argparse.Namespace) -> TrainConfig:
    """The validated config, checked against the launched world size before anything is built."""
    cfg = build_config(TrainConfig, args, _DESTS, args.config, section="train")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        cfg.check_world_size(world_size)
    except ValueError as e:
        raise ConfigError(f"{args.config or 'command line'}: parallel: {e}") from None
    return cfg


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args)
    from ..telemetry import fail, say
    from .trackers import TrackerError, require_packages

    try:
        require_packages(cfg.observability.trackers)  # before torch: a missing package fails in a second
    except TrackerError as e:
        return fail("train", str(e), "TrackerUnavailable")

    say("train", "importing torch", time.perf_counter())
    from ..checkpoint.training import CheckpointMismatch
    from ..data.sources import DataError
    from ..device import select_backend
    from .loop import train
    from .numerics import NumericFault

    try:
        result = train(cfg, select_backend(cfg.device))
    except CheckpointMismatch as e:
        return fail("train", f"cannot load checkpoint: {e}", "CheckpointMismatch")
    except DataError as e:
        return fail("train", f"bad training data: {e}", "DataError")
    except TrackerError as e:
        return fail("train", str(e), "TrackerUnavailable")
    except NumericFault as e:
        # exit 2, the engine's deliberate refusal: a restart would meet the same fault (the count is checkpointed)
        return fail("train", str(e), "NumericFault", extra=e.report())
    if result.preempted:
        return preempted(result)
    if not result.losses and result.iterations >= cfg.training.trainIters:
        # A restart after the final checkpoint (a fault during the last save's upload, a stall at the very end):
        # the training is complete, not failed.
        print(f"ascend-engine train: the checkpoint is at iteration {result.iterations} of "
              f"{cfg.training.trainIters}: nothing left to train", file=sys.stderr, flush=True)
        return 0
    if not result.losses or result.losses[-1] != result.losses[-1]:  # no step ran, or the loss is NaN
        return fail("train", "training produced no finite loss", "NoFiniteLoss", exit_code=1)
    return 0


def preempted(result) -> int:
    """Each pod's first worker leaves the reason where the operator reads it (the termination message), so the
    pod counts as preempted whatever exit code torchrun turns this into."""
    from ..telemetry import report_result
    from .preemption import PREEMPTED_EXIT_CODE

    if os.environ.get("LOCAL_RANK", "0") == "0":
        report_result({"status": "Failed", "reason": "Preempted", "iteration": result.iterations,
                       "checkpoint": result.checkpoint})
    return PREEMPTED_EXIT_CODE
