"""Preemption under torchrun: SIGTERM to torchrun (what the kubelet sends the container) mid-run makes every
worker finish its step, save a checkpoint of it and exit with the retryable code; no completed step is lost and
a rerun resumes from the step after it. Prints the SIGTERM-to-checkpoint time."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest
import yaml
from test_train_torchrun import LINE, TINY, VENV_BIN, assert_ok, free_port, run_train

pytestmark = pytest.mark.engine


def test_sigterm_saves_the_current_step_and_the_rerun_resumes(tmp_path):
    ckpt = tmp_path / "ckpt"
    config = {**TINY, "training": {**TINY["training"], "trainIters": 400},
              "checkpoint": {"save": str(ckpt), "load": str(ckpt), "saveInterval": 2}}  # background saves in flight
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(config))
    report = tmp_path / "termination-log"
    cmd = [str(VENV_BIN / "torchrun"), "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
           str(free_port()), "-m", "ascend_engine.cli", "train", "--config", str(tmp_path / "job.yaml")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "60",
           "ASCEND_TERMINATION_LOG": str(report)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    seen, completed = [], 0
    for line in proc.stdout:  # wait until a few steps are done, then preempt
        seen.append(line)
        if m := LINE.search(line):
            completed = int(m[1])
            if completed >= 3:
                break
    # A hang diagnosis on the way: SIGUSR1 makes a worker print every thread's stack and train on. One worker at a
    # time: both write to the same pipe, and two dumps at once interleave character by character.
    workers = _children(proc.pid)
    assert len(workers) == 2, workers
    start = len(seen)
    for pid in workers:
        os.kill(pid, signal.SIGUSR1)
        for line in proc.stdout:  # the dump ends with the interpreter's entry point, the main thread's outermost frame
            seen.append(line)
            if "in _run_module_as_main" in line:
                break
    for line in proc.stdout:
        seen.append(line)
        if (m := LINE.search(line)) and int(m[1]) > completed + 2:
            break
    dump = "".join(seen[start:])
    # each worker's main thread in the training loop, and its other threads (the preemption watchdog) too
    assert dump.count("Current thread 0x") == 2 and dump.count("Thread 0x") >= 2, dump[-3000:]
    assert 'ascend_engine/train/loop.py", line' in dump and "in _watch" in dump, dump[-3000:]
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=120)
    output = "".join(seen) + rest
    assert proc.returncode != 0, output[-3000:]  # torchrun itself reports the signal

    stopped = re.search(r"preempted: stopped after iteration (\d+), checkpoint (\S+) ([\d.]+)s after SIGTERM", output)
    assert stopped, output[-4000:]
    iteration, saved_in = int(stopped[1]), float(stopped[3])
    logged = [int(m[1]) for m in LINE.finditer(output)]
    assert iteration >= max(logged) >= completed and iteration < 400, (iteration, logged)
    print(f"SIGTERM to checkpoint of iteration {iteration}: {saved_in:.2f}s in the engine, "
          f"{time.monotonic() - sent:.2f}s until torchrun exited (tiny model, 2 CPU ranks, loaded machine)")
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == str(iteration)
    assert sorted(p.name for p in (ckpt / f"iter_{iteration:07d}").iterdir()) == ["manifest.json", "mp_rank_00"]
    assert json.loads(report.read_text()) == {"status": "Failed", "reason": "Preempted", "iteration": iteration,
                                              "checkpoint": str(ckpt / f"iter_{iteration:07d}")}

    # two more steps only: a shorter schedule than the checkpoint's, which the run must be told to accept
    rerun, steps = run_train(tmp_path, config, "--train-iters", str(iteration + 2), "--override-opt-param-scheduler",
                             name="rerun.yaml")
    assert_ok(rerun)
    assert "loaded checkpoint" in rerun.stdout
    assert [s[0] for s in steps] == [iteration + 1, iteration + 2]
    assert steps[0][1] == 4 * (iteration + 1)  # the data position continues too


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started (torchrun's workers), from /proc."""
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(child) for child in f.read().split()]
    return out
