"""In-process restarts through the real launcher, engine and warm spare: two pods of one process each (TP=2, the
command line the operator renders: c10d rendezvous on pod 0, ``--max-restarts``, and the in-process settings in
the environment), a tiny GPT checkpointing every 4 steps.

One run meets two failures. Rank 1 raises in its step 6 (or the first after checkpoint 4 is promoted): both ranks
restart the training function in their own processes (the pids do not change) and load that checkpoint from host
memory. Later rank 1's process is killed: pod 1's
agent hands its warm spare the dead worker's place, rank 0 restarts in its process, and the spare receives rank
1's checkpoint files from rank 0, which holds their replica. No in-place restart happens, both pods end with 0,
and every loss equals an uninterrupted twin's bit for bit (the same ops in the same order)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from test_train_torchrun import LINE, TINY, free_port

pytestmark = pytest.mark.engine

WORKER = Path(__file__).with_name("inprocess_worker.py")
ITERS = 16


def launch(folder: Path, pod: int, port: int, config: Path) -> subprocess.Popen:
    """One pod's launcher, as operator/ascend_operator/render/train_job.py renders it (POD_IP is 127.0.0.1)."""
    cmd = [sys.executable, "-m", "ascend_engine.launcher", "--nnodes=2", "--nproc-per-node=1",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=job-{port}",
           f"--rdzv-conf=is_host={int(pod == 0)}", "--local-addr=127.0.0.1", "--max-restarts=1",
           str(WORKER), str(folder), "train", "--config", str(config)]
    env = {**os.environ, "NODE_RANK": str(pod), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "ASCEND_INPROCESS_RESTARTS": "2",
           "ASCEND_WARM_SPARES": "1", "ASCEND_TERMINATION_LOG": str(folder / f"termination-{pod}"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(WORKER.parent), os.environ.get("PYTHONPATH")]))}
    with open(folder / f"launcher-{pod}.log", "w") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def run(folder: Path, faults) -> tuple[list[subprocess.Popen], list[str]]:
    folder.mkdir()
    config = folder / "job.yaml"
    config.write_text(yaml.safe_dump({
        **TINY, "parallel": {"tensorModelParallelSize": 2},
        "training": {**TINY["training"], "trainIters": ITERS},
        "checkpoint": {"save": str(folder / "ckpt"), "load": str(folder / "ckpt"), "saveInterval": 4},
        "observability": {"metricsPort": 0, "logInterval": 1}}))
    port = free_port()
    procs = [launch(folder, pod, port, config) for pod in (0, 1)]
    try:
        faults(folder, procs)
        deadline = time.monotonic() + 300
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return procs, [(folder / f"launcher-{pod}.log").read_text() for pod in (0, 1)]


def at(folder: Path, rank: int) -> dict:
    try:
        return json.loads((folder / f"at-{rank}").read_text())
    except (OSError, ValueError):
        return {}


def wait_for(what: str, until, procs, folder: Path, seconds: float = 240):
    deadline = time.monotonic() + seconds
    while not (value := until()):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            logs = "\n".join((folder / f"launcher-{pod}.log").read_text()[-4000:] for pod in (0, 1))
            raise AssertionError(f"{what}; launchers {[p.poll() for p in procs]}:\n{logs}")
        time.sleep(0.1)
    return value


def losses(out: str) -> dict[int, list[float]]:
    seen: dict[int, list[float]] = {}
    for m in LINE.finditer(out):
        seen.setdefault(int(m[1]), []).append(float(m[4]))
    return seen


def test_a_rank_that_raises_then_a_killed_rank_recover_in_process_with_the_twins_losses(tmp_path):
    pids: dict[str, int] = {}

    def faults(folder: Path, procs) -> None:
        first = wait_for("rank 1 never started", lambda: at(folder, 1), procs, folder)
        pids["rank0"] = wait_for("rank 0 never started", lambda: at(folder, 0), procs, folder)["pid"]
        pids["rank1"] = first["pid"]
        (folder / "hold").write_text(json.dumps([1, 10]))
        (folder / "raise").write_text(json.dumps([1, 6]))
        wait_for("rank 1 did not reach iteration 10 after the raise",
                 lambda: at(folder, 1).get("iteration", 0) == 10 and not (folder / "raise").exists(), procs, folder)
        wait_for("no warm spare in pod 1", lambda: "[spare] warm spare" in (folder / "launcher-1.log").read_text(),
                 procs, folder)
        spare = int(re.search(r"\[spare\] warm spare (\d+) ready", (folder / "launcher-1.log").read_text())[1])
        threads = [(Path(f"/proc/{spare}/task") / t / "comm").read_text().strip()
                   for t in os.listdir(f"/proc/{spare}/task")]
        # the rehearsal's process groups are let go: each held gloo loop threads whose wake-ups cost an idle spare
        # 15 ms of CPU a second (51 threads before)
        assert not [t for t in threads if "gloo" in t], threads
        victim = at(folder, 1)
        pids["rank1 after raise"] = victim["pid"]
        os.kill(victim["pid"], signal.SIGKILL)  # while it waits before its step 10
        (folder / "hold").unlink()
        pids["spare"] = wait_for("no spare took rank 1", lambda: (a := at(folder, 1)).get("pid") != victim["pid"]
                                 and a.get("pid"), procs, folder)

    procs, (out0, out1) = run(tmp_path / "faults", faults)
    assert [p.returncode for p in procs] == [0, 0], out0[-5000:] + out1[-5000:]
    twin_procs, (twin0, _) = run(tmp_path / "twin", lambda folder, procs: None)
    assert [p.returncode for p in twin_procs] == [0, 0], twin0[-5000:]

    both = out0 + out1
    assert "in-place restart" not in both, both[-5000:]  # nothing went to the next level
    assert re.search(r"\[in-process\] in-process restart 1/2: rank 1 raised RuntimeError: injected fault", both)
    assert re.search(r"\[torchrun\] in-process restart 2/2: local rank 0 killed by SIGKILL; warm spare \d+ takes "
                     r"local rank 0", out1), out1[-3000:]
    # in-process: rank 0 never changed process, rank 1 only when it was killed
    assert pids["rank1 after raise"] == pids["rank1"] and at(tmp_path / "faults", 0)["pid"] == pids["rank0"]
    assert pids["spare"] != pids["rank1"]
    # both restarts loaded the checkpoint from host memory (the spare its own files, from rank 0's replica)
    events = [json.loads(line.split("event: ", 1)[1]) for line in out0.splitlines()
              if "RecoveredInProcess" in line and "event: " in line]
    assert [e["message"].split(":")[0] for e in events] == ["in-process restart 1/2", "in-process restart 2/2"], \
        out0[-4000:]
    assert all("(host memory)" in e["message"] for e in events), events
    assert "1 warm spare(s) took the place" in events[1]["message"], events
    # the losses: every iteration's values equal the twin's, those trained again included
    got, want = losses(out0), losses(twin0)
    assert sorted(got) == sorted(want) == list(range(1, ITERS + 1)), (got, want)
    assert {i: set(v) for i, v in got.items()} == {i: set(v) for i, v in want.items()}, (got, want)
    assert sum(len(v) - 1 for v in got.values()) >= 2, got  # steps were trained again
    print("\n".join(line for line in out0.splitlines() if line.startswith("in-process restart")))
