"""Importing megatron-core without paying for ``torch.compile`` at import time (``Backend.apply`` calls it, so
every command that uses Megatron imports it this way).

megatron-core wraps about 40 functions in ``torch.compile`` while its modules load (``megatron.core.jit``'s
``jit_fuser`` and the fusions). Each wrap imports dynamo and inductor and builds a guarded wrapper: about 3 CPU
seconds of every process's start-up (a third of an evaluation's), although the layers we build never call
most of those functions (bias, rope and norm fusions are off). ``torch.compile`` compiles nothing until the
wrapped function's first call anyway, so deferring the wrap itself to that call changes neither what runs nor
when it is compiled: a function that is called is compiled exactly as before.

It also imports ``wandb`` only where we log to W&B: megatron-core's timers and dynamic inference context try
``import wandb`` at module level for logging paths the engine never takes (it logs through its own trackers),
and that import costs about 0.6 CPU seconds of every process's start-up. Hidden during the import, those
modules see W&B as absent; our tracker's own ``import wandb`` afterwards is the real one.
"""
from __future__ import annotations

import functools
import importlib
import sys


def import_megatron_core() -> None:
    """Import ``megatron.core`` (once per process) with its import-time ``torch.compile`` wraps deferred."""
    if "megatron.core" in sys.modules:
        return
    import torch

    real = torch.compile
    torch.compile = _deferred(real)
    hide_wandb = "wandb" not in sys.modules
    if hide_wandb:
        sys.modules["wandb"] = None  # `import wandb` raises ImportError while this entry is None
    try:
        importlib.import_module("megatron.core")  # megatron.core.jit binds jit_fuser to the deferred wrap here
    finally:
        torch.compile = real
        if hide_wandb:
            del sys.modules["wandb"]


def _deferred(compile_):
    """``torch.compile`` that, for a plain function, wraps it only when it is first called."""

    def deferred(model=None, **options):
        if model is None:  # used as @torch.compile(**options)
            return lambda fn: deferred(fn, **options)
        if not callable(model) or not hasattr(model, "__code__"):  # modules and other callables: as before
            return compile_(model, **options)
        compiled = None

        @functools.wraps(model)
        def call(*args, **kwargs):
            nonlocal compiled
            if compiled is None:
                compiled = compile_(model, **options)
            return compiled(*args, **kwargs)

        return call

    return deferred
