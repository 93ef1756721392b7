"""The recovery ladder on the local cluster, every rung: a worker process killed mid-run is replaced by its pod's
warm spare while rank 0 restarts the training function in its own process, both loading the checkpoint from host
memory (InProcess, runPolicy.recovery.inProcessRestarts 1); killed again, the workers are restarted in place by
torchrun's agents (the c10d rendezvous on pod 0; InPlace, inPlaceRestarts 1): no pod is deleted or created, the
job's status and events name the level; killed a third time, the failure falls through to a gang restart
(Replace). The job ends with the loss curve of an uninterrupted twin that runs beside it, and status.goodput's
parts add up to its wall time. With -s it prints each recovery's parts and how long after each kill rank 0
logged a step again."""
from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from ascend_cluster.cluster import LocalCluster

from test_gang_restart import _kubectl, _worker_pid  # noqa: E402
from workspace import create_workspace, quickstart_job  # noqa: E402

pytestmark = pytest.mark.e2e

LOSS = re.compile(r"^ iteration +(\d+)/ +\d+ \|.*\| lm loss: (\S+) \|", re.M)
# room for each kill after the previous recovery caught up, seen through the operator's readings: the first waits
# for pod 1's warm spare, which imports torch and Megatron-core after the first step within the pod's one core,
# beside the training (15-25 s quiet, 53 s on this machine at load 9: 350 steps of the quickstart model)
ITERS = 400
SPARE = re.compile(r"\[spare\] warm spare (\d+) takes the place of rank")


def _job(name: str, spares: int = 1) -> dict:
    job = quickstart_job()
    job["metadata"]["name"] = name
    train = job["spec"]["train"]
    train["training"]["trainIters"] = ITERS
    train["checkpoint"].update(save=f"/workspace/checkpoints/{name}", saveInterval=5)
    train["observability"]["logInterval"] = 1
    job["spec"]["runPolicy"] = {"backoffLimit": 1, "recovery": {"inProcessRestarts": 1, "inPlaceRestarts": 1,
                                                                "warmSpares": spares}}
    return job


def _losses(cluster: LocalCluster, pods: list[str]) -> dict[int, list[str]]:
    """Every loss rank 0 logged, by iteration, in order (an iteration trained again appears twice)."""
    out: dict[int, list[str]] = {}
    for pod in pods:
        path = cluster.root / "pods" / "default" / pod / "container.log"
        for iteration, loss in LOSS.findall(path.read_text() if path.exists() else ""):
            out.setdefault(int(iteration), []).append(loss)
    return out


def _log(cluster: LocalCluster, pod: str) -> str:
    path = cluster.root / "pods" / "default" / pod / "container.log"
    return path.read_text() if path.exists() else ""


def _past_high_water(cluster: LocalCluster, pod: str, restarts: int) -> bool:
    """Whether rank 0's log, after its ``restarts``-th restart (an iteration logged again), has gone past the
    highest iteration logged before it: the engine's own view, without the operator's reading lag."""
    iterations = [int(i) for i, _ in LOSS.findall(_log(cluster, pod))]
    again = [k for k in range(1, len(iterations)) if iterations[k] <= iterations[k - 1]]
    return len(again) >= restarts and iterations[-1] > max(iterations[:again[restarts - 1]])


def _engine_pid(cluster: LocalCluster, pod: str) -> int:
    """Rank 1's training process: the warm spare that took its place, while that one lives, else torchrun's
    worker running ``ascend_engine train``."""
    for pid in reversed(SPARE.findall(_log(cluster, pod))):
        if Path(f"/proc/{pid}").exists():
            return int(pid)
    return _worker_pid(cluster, "default", pod)


def _kill_and_time(cluster: LocalCluster, pod: str, rank0: str) -> float:
    """Kill rank 1's process; seconds until rank 0 logs a training step again."""
    seen = len(_log(cluster, rank0))
    os.kill(_engine_pid(cluster, pod), signal.SIGKILL)
    killed = time.monotonic()
    while not LOSS.search(_log(cluster, rank0)[seen:]):
        assert time.monotonic() - killed < 300, "no step logged after the kill"
        time.sleep(0.05)
    return round(time.monotonic() - killed, 2)


def test_a_killed_worker_recovers_in_place_then_falls_through_to_replace_with_the_same_loss_curve(tmp_path):
    with LocalCluster(fast_storage=True, root=tmp_path / "cluster", operator=True) as cluster:
        create_workspace(cluster)
        resources = cluster.client()
        atj = resources.resolve("atj")
        resources.apply(_job("twin", spares=0))  # the uninterrupted reference (no spare: its CPU is the test's)
        resources.apply(_job("inplace"))

        def status(name="inplace"):
            return resources.get(atj, name, "default").get("status") or {}

        def wait(what, until, seconds, name="inplace"):
            deadline = time.monotonic() + seconds
            while not until(s := status(name)):
                assert time.monotonic() < deadline, f"{what}: {s}"
                time.sleep(0.3)
            return s

        def pod_uids():
            return {p["metadata"]["name"]: p["metadata"]["uid"] for p in resources.list(resources.resolve("pods"),
                                                                                          "default")
                    if p["metadata"]["name"].startswith("inplace-")}

        wait("no checkpoint at 10", lambda s: (s.get("progress") or {}).get("lastCheckpointIteration", 0) >= 10, 300)
        deadline = time.monotonic() + 300
        while "[spare] warm spare" not in _log(cluster, "inplace-1-0"):  # pod 1's spare has imported torch
            assert time.monotonic() < deadline, _log(cluster, "inplace-1-0")[-3000:]
            time.sleep(0.3)
        before = pod_uids()
        trained_again = {"InProcess": _kill_and_time(cluster, "inplace-1-0", "inplace-0-0")}  # rank 1 dies
        recovered = wait("no in-process recovery", lambda s: s.get("recoveries"), 120)
        assert recovered["recoveries"][0]["level"] == "InProcess", recovered["recoveries"]
        assert recovered.get("restarts", 0) == 0 and pod_uids() == before  # no pod replaced
        # caught up (the operator has read it and rank 0's log shows it), so the next kill's lost steps are its own
        wait("in process: not caught up", lambda s: (s.get("recoveries") or [{}])[0].get("totalSeconds") is not None
             and _past_high_water(cluster, "inplace-0-0", 1), 200)
        trained_again["InPlace"] = _kill_and_time(cluster, "inplace-1-0", "inplace-0-0")  # in-process used up
        recovered = wait("no in-place recovery", lambda s: len(s.get("recoveries") or []) >= 2, 120)
        assert recovered["recoveries"][1]["level"] == "InPlace", recovered["recoveries"]
        assert recovered.get("restarts", 0) == 0 and pod_uids() == before  # no pod replaced
        wait("in place: not caught up", lambda s: (s.get("goodput") or {}).get("inPlaceRestarts") == 1 and
             "checkpointLoad" in (s.get("recoveries") or [{}, {}])[1].get("seconds", {}) and
             _past_high_water(cluster, "inplace-0-0", 2), 200)
        os.kill(_worker_pid(cluster, "default", "inplace-1-0"), signal.SIGKILL)  # in-place restarts used up
        final = wait("did not finish", lambda s: s.get("phase") in ("Succeeded", "Failed"), 400)
        twin = wait("twin did not finish", lambda s: s.get("phase") in ("Succeeded", "Failed"), 400, "twin")
        events = _kubectl(cluster, "get", "events", "--field-selector", "involvedObject.name=inplace")
        losses = _losses(cluster, ["inplace-0-0", "inplace-0-1"])
        reference = _losses(cluster, ["twin-0-0"])
        resources.close()

    print(json.dumps({"recoveries": final.get("recoveries"), "goodput": final.get("goodput"),
                      "twin": twin.get("goodput"), "trainedAgainSeconds": trained_again},
                     indent=1))  # the figures docs/faults.md quotes (pytest -s)
    assert final["phase"] == "Succeeded" and twin["phase"] == "Succeeded", (final, twin)
    levels = [(r["level"], r["reason"]) for r in final["recoveries"]]
    assert levels == [("InProcess", "WorkerFailed"), ("InPlace", "WorkerFailed"),
                      ("Replace", "InPlaceRecoveryExhausted")], final["recoveries"]
    assert "host memory" in final["recoveries"][0]["message"] and "1 warm spare" in final["recoveries"][0]["message"]
    assert final["restarts"] == 1 and twin.get("restarts", 0) == 0 and not twin.get("recoveries")
    # the loss curve: every iteration's last value is the twin's, and every step trained again repeated its value
    every = list(range(1, ITERS + 1))
    assert sorted(reference) == every and sorted(losses) == every, (losses, reference)
    assert {i: v[-1] for i, v in losses.items()} == {i: v[-1] for i, v in reference.items()}
    assert all(len(set(v)) == 1 for v in losses.values()), losses
    assert sum(len(v) > 1 for v in losses.values()) >= 3  # the kills did cost steps
    # each recovery's parts add up to its total, and the job's to its wall time
    for r in final["recoveries"]:
        parts = r["seconds"]
        assert set(parts) == {"detection", "stopping", "podStart", "rendezvous", "checkpointLoad", "retrain"}, r
        assert all(v >= 0 for v in parts.values()) and abs(sum(parts.values()) - r["totalSeconds"]) < 0.5, r
        assert r["fromIteration"] % 5 == 0, r
    # the steps trained again, by the status, are the steps rank 0 logged twice (those after the operator's last
    # reading of the old process included: the engine's record beside the checkpoints holds them)
    assert sum(r["lostIterations"] for r in final["recoveries"]) == sum(len(v) - 1 for v in losses.values()), \
        (final["recoveries"], losses)
    assert final["recoveries"][1]["seconds"]["podStart"] < 5  # in place: no pod to schedule
    assert final["recoveries"][0]["seconds"]["podStart"] < 5  # in process: the spare was already started
    g = final["goodput"]
    assert abs(g["productiveSeconds"] + g["recoverySeconds"] + g["otherSeconds"] - g["wallSeconds"]) < 0.05, g
    assert 0 < g["goodput"] < 1 and g["otherSeconds"] >= 0 and g["highWaterIteration"] == ITERS, g
    rows = [line.split(None, 4) for line in events.splitlines()[1:]]
    in_process = [row[4] for row in rows if row[2] == "RecoveredInProcess"]
    assert len(in_process) == 1 and in_process[0].startswith("in-process restart 1/1: pod index 1 local rank 0 "
                                                             "killed by SIGKILL"), events
    in_place = [row[4] for row in rows if row[2] == "RecoveredInPlace"]
    assert len(in_place) == 1 and in_place[0].startswith("in-place restart 1/1: ") and \
        "pod index 1 local rank 0 killed by SIGKILL" in in_place[0], events
    assert any(row[2] == "GangRestart" and "recovery level Replace" in row[4] for row in rows), events
