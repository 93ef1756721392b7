"""NVIDIA's in-process restart (``nvidia_resiliency_ext.inprocess.Wrapper``, nvidia-resiliency-ext 0.7) on CPU and
gloo: what it does here, measured, for docs/faults.md's comparison with our own in-process level.

nvidia-resiliency-ext 0.7 ships one wheel, cp312 manylinux_2_39 (Python 3.12, glibc 2.39): pip refuses it for this
project's Python 3.11 on glibc 2.36, and there is no source release. Its ``inprocess`` package is pure Python, so
this script runs it from the unpacked wheel (``--nvrx DIR``; ``pip download --no-deps nvidia-resiliency-ext==0.7.0
--python-version 3.12 --platform manylinux_2_39_x86_64 --only-binary=:all:`` and unzip it) on this Python.

Three processes, started as plain processes with the torch.distributed variables (torchrun would stop them all at
the first death: NVRx's own known issue), active world 2 and one inactive reserve rank
(``MaxActiveWorldSize(2)``, ``ShiftRanks``). A tiny model trains with an all-reduce per step; at step 5 of the
first try rank 1 either raises (``--fault raise``) or kills itself with SIGKILL (``--fault kill``). The wrapper
must restart the function on the healthy ranks, in their processes, with the reserve taking the dead rank's place.

    .venv/bin/python benchmarks/nvrx_inprocess.py --nvrx /tmp/nvrx/x --fault raise
    .venv/bin/python benchmarks/nvrx_inprocess.py --nvrx /tmp/nvrx/x --fault kill
"""
# no `from __future__ import annotations`: the wrapper reads the CallWrapper annotation as a class

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEPS = 10
FAULT_STEP = 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(out: Path, fault: str) -> None:
    os.environ["TORCH_CPP_LOG_LEVEL"] = "error"
    import datetime
    from typing import Optional

    import torch

    import nvidia_resiliency_ext.inprocess as inprocess

    initial_rank = int(os.environ["RANK"])
    log = out / f"rank{initial_rank}.jsonl"

    def say(**what):
        with open(log, "a") as f:
            f.write(json.dumps({"at": time.time(), **what}) + "\n")

    @inprocess.Wrapper(
        store_kwargs={"port": int(os.environ["MASTER_PORT"]) + 1},
        rank_assignment=inprocess.Compose(inprocess.rank_assignment.MaxActiveWorldSize(2),
                                          inprocess.rank_assignment.ShiftRanks()),
        monitor_process_logfile=str(out / "monitor-{rank}.log"),
        soft_timeout=datetime.timedelta(seconds=20), hard_timeout=datetime.timedelta(seconds=30),
        heartbeat_timeout=datetime.timedelta(seconds=10), barrier_timeout=datetime.timedelta(seconds=60),
        completion_timeout=datetime.timedelta(seconds=60),
    )
    def train(call_wrapper: Optional[inprocess.CallWrapper] = None):
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        say(event="enter", iteration=call_wrapper.iteration, rank=rank, world=world)
        store = torch.distributed.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + 2
                                           + call_wrapper.iteration, world, is_master=rank == 0,
                                           multi_tenant=True, wait_for_workers=True)
        torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                             timeout=datetime.timedelta(seconds=10))
        torch.manual_seed(0)
        model = torch.nn.Linear(64, 64)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(1, STEPS + 1):
            if call_wrapper.iteration == 0 and step == FAULT_STEP and initial_rank == 1:
                say(event="fault", fault=fault)
                if fault == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise RuntimeError("injected fault")
            loss = model(torch.ones(4, 64)).pow(2).mean()
            loss.backward()
            for p in model.parameters():
                torch.distributed.all_reduce(p.grad)
            opt.step()
            opt.zero_grad()
            say(event="step", iteration=call_wrapper.iteration, step=step, rank=rank, loss=float(loss))
        torch.distributed.barrier()
        return "done"

    try:
        result = train()
        say(event="return", result=result)
    except BaseException as e:  # noqa: BLE001 - what ended the wrapper is the finding
        say(event="raised", error=f"{type(e).__name__}: {e}"[:500])
        raise


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nvrx", required=True, help="the unpacked nvidia-resiliency-ext wheel")
    parser.add_argument("--fault", choices=["raise", "kill"], default="raise")
    parser.add_argument("--local-rank", action="store_true",
                        help="start the workers with LOCAL_RANK, as torchrun does (the wrapper then adds its GPU, "
                             "NVLink and NIC health checks, which fail without NVML)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        sys.path.insert(0, args.nvrx)
        worker(Path(args.worker), args.fault)
        return
    out = Path(tempfile.mkdtemp(prefix="nvrx-"))
    port = free_port()
    procs = []
    for rank in range(3):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        if args.local_rank:
            env.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="3")
        procs.append(subprocess.Popen([sys.executable, __file__, "--nvrx", args.nvrx, "--fault", args.fault,
                                       "--worker", str(out)], env=env, stdout=open(out / f"out{rank}.log", "w"),
                                      stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 240
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.5)
    for p in procs:
        if p.poll() is None:
            p.kill()
    events = sorted((json.loads(line) | {"initialRank": r} for r in range(3)
                     for line in (out / f"rank{r}.jsonl").read_text().splitlines()
                     if (out / f"rank{r}.jsonl").exists()), key=lambda e: e["at"])
    fault = next((e["at"] for e in events if e["event"] == "fault"), None)
    again = next((e["at"] for e in events if e["event"] == "step" and e["iteration"] > 0), None)
    print(json.dumps({"fault": args.fault, "exit codes": [p.returncode for p in procs],
                      "restart to first step (s)": round(again - fault, 2) if fault and again else None,
                      "tries": sorted({(e["initialRank"], e["iteration"], e["rank"]) for e in events
                                       if e["event"] == "enter"}),
                      "ended": [e for e in events if e["event"] in ("return", "raised")],
                      "logs": str(out)}, indent=1, default=str))


if __name__ == "__main__":
    main()
