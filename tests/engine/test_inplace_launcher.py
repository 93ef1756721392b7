"""In-place recovery through the real launcher (``python -m ascend_engine.launcher``, torchrun's agent inside it),
with the command line the operator renders for a pod (c10d rendezvous hosted by pod 0, ``--max-restarts N``,
``NODE_RANK`` = pod index) and small workers that fail through the engine's own entry point (``inplace_worker.py``):

* the cause travels: every failure's error line and exit code are in the launcher's record, and the termination
  report names the last one when the restarts run out;
* a failure that repeats with no step trained in between is not retried: ``RepeatedFailure``, permanent;
* the limit is the job's: two pods, kills of rank 0, rank 1, rank 1 with N = 2 make exactly 2 in-place restarts,
  and the third failure ends both pods, every record and line saying k/2 with k <= 2.
"""
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

from inplace_worker import MEGATRON_ASSERTION
from test_train_torchrun import free_port

pytestmark = pytest.mark.engine

WORKER = Path(__file__).with_name("inplace_worker.py")
LINE = f"AssertionError: {MEGATRON_ASSERTION}"


def launch(folder: Path, pod: int, nnodes: int, port: int, restarts: int) -> subprocess.Popen:
    """One pod's launcher, as operator/ascend_operator/render/train_job.py renders it (POD_IP is 127.0.0.1 here)."""
    cmd = [sys.executable, "-m", "ascend_engine.launcher", f"--nnodes={nnodes}", "--nproc-per-node=1",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=job",
           f"--rdzv-conf=is_host={int(pod == 0)}", "--local-addr=127.0.0.1", f"--max-restarts={restarts}",
           str(WORKER), "--dir", str(folder)]
    env = {**os.environ, "NODE_RANK": str(pod), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(WORKER.parent), os.environ.get("PYTHONPATH")])),
           "ASCEND_TERMINATION_LOG": str(folder / f"termination-{pod}")}
    with open(folder / f"launcher-{pod}.log", "w") as log:  # a file, not a pipe: workers outlive a killed launcher
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def started(folder: Path, rank: int, n: int, procs: list[subprocess.Popen], seconds: float = 120) -> dict:
    """The n-th start of global rank ``rank``'s worker (waits for it)."""
    path = folder / f"started-{rank}-{n}.json"
    deadline = time.monotonic() + seconds
    while not path.exists():
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            outputs = stop(folder, procs)
            raise AssertionError(f"no start {n} of rank {rank}; launchers exited {[p.returncode for p in procs]}:\n"
                                 + "\n".join(out[-3000:] for out in outputs))
        time.sleep(0.1)
    return json.loads(path.read_text())


def finish(folder: Path, procs: list[subprocess.Popen], seconds: float) -> list[str]:
    """The launchers' logs once they have all exited by themselves (stopped after ``seconds``: a failure)."""
    deadline = time.monotonic() + seconds
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    hung = [i for i, p in enumerate(procs) if p.poll() is None]
    outputs = stop(folder, procs)
    assert not hung, f"launchers of pods {hung} did not give up:\n" + "\n".join(out[-4000:] for out in outputs)
    return outputs


def stop(folder: Path, procs: list[subprocess.Popen]) -> list[str]:
    """End what is left as a pod's deletion would (SIGTERM, then SIGKILL), the workers too (torchrun starts them
    in sessions of their own), and return each launcher's log."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 15
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    for start in folder.glob("started-*.json"):
        pid = json.loads(start.read_text())["pid"]
        try:  # only our worker: its command line names this test's folder
            if str(folder).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass
    return [(folder / f"launcher-{i}.log").read_text() for i in range(len(procs))]


def report(folder: Path, pod: int) -> dict:
    return json.loads((folder / f"termination-{pod}").read_text())


def test_the_cause_travels_with_every_failure_and_the_last_one_ends_the_report(tmp_path):
    """Every try trains a step, then fails: retried N times, then the report names the worker's error line."""
    (tmp_path / "mode").write_text("assert-after-step")
    procs = [launch(tmp_path, 0, 1, free_port(), restarts=3)]
    starts = [started(tmp_path, 0, n, procs) for n in range(1, 5)]
    out = finish(tmp_path, procs, 60)[0]
    assert procs[0].returncode != 0 and not (tmp_path / "started-0-5.json").exists(), out[-3000:]
    assert report(tmp_path, 0) == {
        "status": "Failed", "reason": "InPlaceRecoveryExhausted", "permanent": False, "error": LINE, "exitCode": 1,
        "inPlaceRestarts": 3, "podIndex": 0,
        "message": f"{LINE} (local rank 0, exit code 1) after 3 in-place restart(s) "
                   "(runPolicy.recovery.inPlaceRestarts 3)"}
    # the record the new workers read names each failure's line and exit code, restart after restart
    for n, start in enumerate(starts[1:], start=1):
        record = start["record"]
        assert record["restarts"] == n and start["restartCount"] == str(n)
        assert [(f["error"], f["exitCode"]) for f in record["last"]["failures"]] == [(LINE, 1)]
        assert [(f["round"], f["error"]) for f in record["failures"]] == [(k, LINE) for k in range(n)]
    for n in (1, 2, 3):
        assert f"[torchrun] in-place restart {n}/3: {LINE} (local rank 0, exit code 1)" in out, out[-3000:]


def test_the_same_error_again_before_any_step_is_permanent(tmp_path):
    """The same error again with no step trained in between: the second failure is the last, permanent, with the
    line first (a layout Megatron refuses while building the model fails the same way every time)."""
    folder = tmp_path
    (folder / "mode").write_text("assert")
    procs = [launch(folder, 0, 1, free_port(), restarts=3)]
    started(folder, 0, 2, procs)
    out = finish(folder, procs, 60)[0]
    assert procs[0].returncode != 0 and not (folder / "started-0-3.json").exists(), out[-3000:]
    assert report(folder, 0) == {
        "status": "Failed", "reason": "RepeatedFailure", "permanent": True, "error": LINE, "exitCode": 1,
        "inPlaceRestarts": 1, "podIndex": 0,
        "message": f"{LINE} (local rank 0, exit code 1): the same error as the failure before, with no step "
                   "trained since; not retried in place (in-place restarts used: 1 of 3)"}


def test_the_in_place_restart_limit_is_the_jobs_not_each_pods(tmp_path):
    """Two pods of one process each, N = 2. Round 1 ranks all-reduce, so killing rank 0 fails rank 1 too (one
    restart, however many agents see a failure); round 2 does not, so killing rank 1 leaves pod 0's worker healthy
    (its agent restarts because pod 1 opened a new round); in round 3 killing rank 1 again is the third failure:
    both pods give up. Before the count was the job's, pod 0's agent had used one restart of its own and restarted
    a third time ("in-place restart 3/2")."""
    port = free_port()
    (tmp_path / "mode").write_text("collective")
    procs = [launch(tmp_path, pod, 2, port, restarts=2) for pod in (0, 1)]
    first = [started(tmp_path, rank, 1, procs) for rank in (0, 1)]
    assert all(s["event"] is None and s["record"]["restarts"] == 0 for s in first)

    (tmp_path / "mode").write_text("idle")
    os.kill(first[0]["pid"], signal.SIGKILL)
    second = [started(tmp_path, rank, 2, procs) for rank in (0, 1)]
    (tmp_path / "mode").write_text("collective")
    os.kill(second[1]["pid"], signal.SIGKILL)
    third = [started(tmp_path, rank, 3, procs) for rank in (0, 1)]
    os.kill(third[1]["pid"], signal.SIGKILL)
    outputs = finish(tmp_path, procs, 90)
    assert not list(tmp_path.glob("started-*-4.json")), "a fourth round started:\n" + "\n".join(outputs)

    for n, starts in ((1, second), (2, third)):
        for rank, s in enumerate(starts):
            assert s["record"]["restarts"] == n and s["restartCount"] == str(n), (n, rank, s)
            assert s["event"].startswith(f"in-place restart {n}/2: "), s["event"]
    # the event names the killed worker (and the failure it caused in the other pod, with its error line)
    assert "pod index 0 local rank 0 killed by SIGKILL" in second[0]["event"], second[0]["event"]
    assert "pod index 1 local rank 0 killed by SIGKILL" in third[0]["event"], third[0]["event"]
    pod1_round1 = second[1]["record"]["last"]["failures"]  # rank 1 failed with its peer, or its agent saw the round
    assert all(f["exitCode"] == 1 and f["error"] for f in pod1_round1), pod1_round1
    assert second[0]["record"]["last"]["failures"][0]["signal"] == "SIGKILL"

    said = [int(k) for out in outputs for k in re.findall(r"in-place restart (\d+)/2", out)]
    assert said and max(said) == 2, outputs
    # Both pods give up after 2 restarts. The first to give up leaves its report in the store and the other, whose
    # worker failed in the same round, gives up with it: usually pod 1, whose agent sees the kill at once, while
    # pod 0's worker still has to meet the broken all-reduce and exit. On a starved machine the order can turn, and
    # either pod may carry its own report; each report is one of the two.
    killed = {"status": "Failed", "reason": "InPlaceRecoveryExhausted", "permanent": False, "exitCode": -9,
              "inPlaceRestarts": 2, "podIndex": 1,
              "message": "local rank 0 killed by SIGKILL after 2 in-place restart(s) "
                         "(runPolicy.recovery.inPlaceRestarts 2)"}
    for pod in (0, 1):
        r = report(tmp_path, pod)
        line = r.get("error")
        consequence = (r["podIndex"] == 0 and r["exitCode"] == 1 and r["reason"] == "InPlaceRecoveryExhausted"
                       and r["inPlaceRestarts"] == 2 and r["message"] == f"{line} (local rank 0, exit code 1) "
                       "after 2 in-place restart(s) (runPolicy.recovery.inPlaceRestarts 2)")
        assert r == killed or consequence, (pod, r, outputs[pod][-3000:])
    assert all(p.returncode != 0 for p in procs)
