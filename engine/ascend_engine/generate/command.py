"""``ascend-engine generate --load CKPT --tokenizer-name-or-path TOK --prompt TEXT``, under torchrun when the
checkpoint is split (world size = TP x PP of the checkpoint).

With a KV cache (megatron-core's static inference context) by default, so each new token costs one position's
forward; ``--no-kv-cache`` recomputes the whole sequence per token (the same tokens; a reference for checking).
"""
from __future__ import annotations

import argparse
import time

from ..config.loader import add_flags, build_config
from .config import GenerateConfig

_DESTS: dict[str, tuple[str, ...]] = {}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="GenerateConfig YAML")
    _DESTS.update(add_flags(parser, GenerateConfig))


def run(args: argparse.Namespace) -> int:
    cfg = build_config(GenerateConfig, args, _DESTS, args.config)
    from ..telemetry import say, started_up

    started = time.perf_counter()  # start-up lines go to stderr: stdout carries only the generated text
    say("generate", "importing torch and Megatron-core", started)
    from ..checkpoint.training import CheckpointMismatch
    from ..telemetry import fail
    from .sample import generate

    say("generate", f"loading {cfg.load} and generating up to {cfg.maxNewTokens} tokens", started)
    try:
        text = generate(cfg)
    except (CheckpointMismatch, ValueError) as e:  # a checkpoint that does not fit, a prompt that is too long
        return fail("generate", str(e), type(e).__name__)
    started_up()
    if text is not None:
        print(text, flush=True)
    return 0
