"""The tests' own torchrun ranks, started as the engine's commands start: Megatron imported through
``Backend.apply`` (its import-time ``torch.compile`` wraps deferred, ~3 CPU s a rank) and an exit that does not
walk torch's objects (``gc.freeze``, ~1.5 s a rank), so a worker script costs what an engine rank costs."""
from __future__ import annotations

import gc
from typing import Callable

from ascend_engine.device import select_backend


def run_rank(work: Callable[..., object], *args: object) -> None:
    select_backend("cpu").apply()
    work(*args)
    gc.freeze()
