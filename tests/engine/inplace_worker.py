"""A worker for the in-place recovery tests, run by the real launcher (``python -m ascend_engine.launcher ...
inplace_worker.py --dir D``) through the engine's own entry point (``ascend_engine.cli.main``, with this module as
one more command), so its failures take the engine's path: ``report_failure``, the error file, the exit code.

What it does is read from ``D/mode`` when it starts (the test changes it between rounds):

* ``collective``: join the process group as the engine does (``inplace.worker_store``, gloo), say it has trained a
  step, then all-reduce every 0.1 s: a peer that dies makes this worker fail too, as a real job's ranks do;
* ``idle``: the same without the all-reduces (a peer's death goes unnoticed until its agent opens a new round);
* ``assert``: fail at once with Megatron's construction-time assertion, before any step;
* ``assert-after-step``: say it has trained a step, then fail the same way.

Each start leaves ``D/started-<rank>-<n>.json``: its pid, torchrun's restart count, the launcher's record as the
worker read it and, with a process group, the RecoveredInPlace event's words the engine's rank 0 would post.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

MEGATRON_ASSERTION = "First dimension of the tensor should be divisible by tensor parallel size"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", required=True)


def _start_file(folder: Path, rank: str, facts: dict) -> None:
    n = 1 + len(list(folder.glob(f"started-{rank}-*.json")))
    tmp = folder / f".started-{rank}-{n}.tmp"
    tmp.write_text(json.dumps({"pid": os.getpid(), **facts}))
    tmp.rename(folder / f"started-{rank}-{n}.json")


def run(args: argparse.Namespace) -> int:
    from ascend_engine.inplace import read_record, trained_a_step

    folder = Path(args.dir)
    mode = (folder / "mode").read_text().strip()
    rank, world = os.environ["RANK"], int(os.environ["WORLD_SIZE"])
    facts = {"mode": mode, "restartCount": os.environ.get("TORCHELASTIC_RESTART_COUNT"), "record": read_record()}
    if mode.startswith("assert"):
        _start_file(folder, rank, facts)
        if mode == "assert-after-step":
            trained_a_step(1)
        raise AssertionError(MEGATRON_ASSERTION)

    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from ascend_engine.inplace import worker_store
    from ascend_engine.train.goodput import GoodputClock, gather_objects

    timeout = timedelta(seconds=60)
    dist.init_process_group("gloo", store=worker_store(world, timeout), rank=int(rank), world_size=world,
                            timeout=timeout)
    clock = GoodputClock(None)
    clock.gather_agents(gather_objects)  # every pod's record, as the engine's rank 0 reads them
    _start_file(folder, rank, {**facts, "event": clock.restart_summary()})
    trained_a_step(1)
    one = torch.ones(1)
    while not (folder / "finish").exists():
        if mode == "collective":
            dist.all_reduce(one)
        time.sleep(0.1)
    return 0


if __name__ == "__main__":
    from ascend_engine import cli

    cli.COMMANDS["inplace-worker"] = ("__main__", "a worker for the in-place recovery tests")
    sys.exit(cli.main(["inplace-worker", *sys.argv[1:]]))
