"""Compare this run's learning-rate / weight-decay schedule with the one a checkpoint was saved with.

Megatron-LM refuses a resume whose schedule differs from the checkpoint's unless told which one wins
(``--override-opt-param-scheduler``: this run's; ``--use-checkpoint-opt-param-scheduler``: the checkpoint's).
megatron-core's scheduler can do either, but its default silently keeps the checkpoint's, so a resume with a
larger ``--train-iters`` would go on decaying towards the old end. This module names every difference with the
setting that produces it, so the error says what to change.
"""
from __future__ import annotations

from typing import Any

# Scheduler attribute -> (keys it is saved under, newest first, as megatron-core reads them; the setting behind it).
SCHEDULE = {
    "max_lr": (("max_lr", "start_lr"), "optimizer.lr (--lr)"),
    "min_lr": (("min_lr",), "optimizer.minLr (--min-lr)"),
    "lr_warmup_steps": (("lr_warmup_steps", "warmup_steps", "warmup_iter"),
                        "optimizer.lrWarmupIters / lrWarmupFraction (--lr-warmup-iters / --lr-warmup-fraction)"),
    "lr_decay_steps": (("lr_decay_steps", "decay_steps", "end_iter"), "training.trainIters (--train-iters)"),
    "lr_decay_style": (("lr_decay_style", "decay_style"), "optimizer.lrDecayStyle (--lr-decay-style)"),
    "start_wd": (("start_wd",), "optimizer.weightDecay (--weight-decay)"),
    "end_wd": (("end_wd",), "optimizer.weightDecay (--weight-decay)"),
    "wd_incr_steps": (("wd_incr_steps",), "training.trainIters (--train-iters)"),
    "wd_incr_style": (("wd_incr_style",), "the weight-decay increment style"),
}


def _saved(state: dict, keys: tuple[str, ...]) -> Any:
    for key in keys:
        if key in state:
            return state[key]
    return None


def schedule_differences(scheduler: Any, saved: dict) -> list[str]:
    """One line per schedule value where ``scheduler`` (built from this run's settings) and ``saved`` differ."""
    out = []
    for attr, (keys, setting) in SCHEDULE.items():
        theirs = _saved(saved, keys)
        ours = getattr(scheduler, attr)
        if theirs is not None and theirs != ours:
            out.append(f"{setting}: this run {ours}, checkpoint {theirs} ({attr})")
    return out


def mismatch_message(where: Any, differences: list[str]) -> str:
    return (f"{where}: the learning-rate schedule differs from the checkpoint's: " + "; ".join(differences)
            + ". Pass --override-opt-param-scheduler (optimizer.overrideOptParamScheduler) to continue with this "
            "run's schedule, or --use-checkpoint-opt-param-scheduler (optimizer.useCheckpointOptParamScheduler) "
            "to keep the checkpoint's")
