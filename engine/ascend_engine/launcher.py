"""``python -m ascend_engine.launcher <torchrun arguments>``: torchrun, saying what it does before it can.

A pod's command starts with torchrun, whose own ``import torch`` takes 5-15 s on a cold node before any engine
line appears; this launcher says so on stderr (again every few seconds, as the engine's start-up lines do) and
then runs torchrun's own ``main`` with the same arguments, in the same process, so signals, exit codes and the
torchrun contract are torchrun's. With ``--max-restarts`` above 0 it records the agent's in-place restarts for
the workers (each failure's error line and exit code) and, when they run out or a failure repeats before a step
was trained, leaves a termination report the operator reads (``ascend_engine.inplace``).
"""
from __future__ import annotations

import gc
import os
import sys
import time

from . import node_rank
from .telemetry import fail, report_result, say, started_up


def _max_restarts(argv: list[str]) -> int:
    for i, arg in enumerate(argv):
        if arg.startswith("--max-restarts=") or arg.startswith("--max_restarts="):
            return int(arg.split("=", 1)[1])
        if arg in ("--max-restarts", "--max_restarts") and i + 1 < len(argv):
            return int(argv[i + 1])
    return 0


def _rdzv_endpoint(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg.startswith("--rdzv-endpoint=") or arg.startswith("--rdzv_endpoint="):
            return arg.split("=", 1)[1]
        if arg in ("--rdzv-endpoint", "--rdzv_endpoint") and i + 1 < len(argv):
            return argv[i + 1]
    return None


def main(argv: list[str] | None = None) -> None:
    started = time.perf_counter()
    say("torchrun", "importing torch", started)
    from torch.distributed.run import main as torchrun_main

    gc.freeze()  # torch's objects live as long as the process: no collection, the exit's included, walks them
    argv = sys.argv[1:] if argv is None else argv
    try:  # with spec.topology a pod's rank comes once the gang is placed (ascend_engine.node_rank)
        argv = node_rank.resolve(argv, started)
    except node_rank.NodeRankTimeout as e:
        sys.exit(fail("torchrun", str(e), "NodeRankTimeout", exit_code=1))
    # The workers leave their error line in torchrun's error files (inplace.record_worker_error); torchrun's main
    # then copies the first one to its own, and without one logs an error saying it has none. The cause reaches
    # the operator through this launcher's report and the workers' own, not through that copy.
    os.environ.setdefault("TORCHELASTIC_ERROR_FILE", os.devnull)
    record = None
    from .inprocess import ENV_ENDPOINT, limit

    if (endpoint := _rdzv_endpoint(argv)) and limit():  # in-process restarts: the workers reach the agents' store
        os.environ[ENV_ENDPOINT] = endpoint
    max_restarts = _max_restarts(argv)
    if max_restarts or os.environ.get(ENV_ENDPOINT):
        from .agent_watch import watch_agent

        record = watch_agent(max_restarts)
    say("torchrun", "starting the workers", started)
    started_up()  # the workers say their own steps from here
    try:
        torchrun_main(argv)
    except BaseException:
        from .agent_watch import exhausted_report

        if record is not None and (report := exhausted_report(record)):
            report_result(report)
        raise


if __name__ == "__main__":
    main()
