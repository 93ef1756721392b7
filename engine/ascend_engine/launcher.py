"""``python -m ascend_engine.launcher <torchrun arguments>``: torchrun, saying what it does before it can.

A pod's command starts with torchrun, whose own ``import torch`` takes 5-15 s on a cold node before any engine
line appears; this launcher says so on stderr (again every few seconds, as the engine's start-up lines do) and
then runs torchrun's own ``main`` with the same arguments, in the same process, so signals, exit codes and the
torchrun contract are torchrun's.
"""
from __future__ import annotations

import sys
import time

from .telemetry import say, started_up


def main(argv: list[str] | None = None) -> None:
    started = time.perf_counter()
    say("torchrun", "importing torch", started)
    from torch.distributed.run import main as torchrun_main

    say("torchrun", "starting the workers", started)
    started_up()  # the workers say their own steps from here
    torchrun_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
