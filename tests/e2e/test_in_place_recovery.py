"""The recovery ladder on the local cluster: a worker process killed mid-run is restarted in place by torchrun's
agents (the c10d rendezvous on pod 0): no pod is deleted or created, the job's status and events name the level;
killed again once in-place restarts are used up (runPolicy.recovery.inPlaceRestarts 1), the failure falls through
to a gang restart (Replace). The job ends with the loss curve of an uninterrupted twin that runs beside it, and
status.goodput's parts add up to its wall time."""
from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest

from ascend_cluster.cluster import LocalCluster

from test_gang_restart import _kubectl, _worker_pid  # noqa: E402
from workspace import create_workspace, quickstart_job  # noqa: E402

pytestmark = pytest.mark.e2e

LOSS = re.compile(r"^ iteration +(\d+)/ +\d+ \|.*\| lm loss: (\S+) \|", re.M)
ITERS = 60  # room for the second kill after the first recovery caught up, seen through the operator's readings


def _job(name: str) -> dict:
    job = quickstart_job()
    job["metadata"]["name"] = name
    train = job["spec"]["train"]
    train["training"]["trainIters"] = ITERS
    train["checkpoint"].update(save=f"/workspace/checkpoints/{name}", saveInterval=5)
    train["observability"]["logInterval"] = 1
    job["spec"]["runPolicy"] = {"backoffLimit": 1, "recovery": {"inPlaceRestarts": 1}}
    return job


def _losses(cluster: LocalCluster, pods: list[str]) -> dict[int, list[str]]:
    """Every loss rank 0 logged, by iteration, in order (an iteration trained again appears twice)."""
    out: dict[int, list[str]] = {}
    for pod in pods:
        path = cluster.root / "pods" / "default" / pod / "container.log"
        for iteration, loss in LOSS.findall(path.read_text() if path.exists() else ""):
            out.setdefault(int(iteration), []).append(loss)
    return out


def _past_high_water(cluster: LocalCluster, pod: str) -> bool:
    """Whether rank 0's log, after its process was restarted (an iteration logged again), has gone past the
    highest iteration logged before the restart: the engine's own view, without the operator's reading lag."""
    path = cluster.root / "pods" / "default" / pod / "container.log"
    iterations = [int(i) for i, _ in LOSS.findall(path.read_text() if path.exists() else "")]
    restart = next((k for k in range(1, len(iterations)) if iterations[k] <= iterations[k - 1]), None)
    return restart is not None and iterations[-1] > max(iterations[:restart])


def test_a_killed_worker_recovers_in_place_then_falls_through_to_replace_with_the_same_loss_curve(tmp_path):
    with LocalCluster(fast_storage=True, root=tmp_path / "cluster", operator=True) as cluster:
        create_workspace(cluster)
        resources = cluster.client()
        atj = resources.resolve("atj")
        resources.apply(_job("twin"))  # the uninterrupted reference
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
        before = pod_uids()
        os.kill(_worker_pid(cluster, "default", "inplace-1-0"), signal.SIGKILL)  # rank 1's process dies
        recovered = wait("no in-place recovery", lambda s: s.get("recoveries"), 120)
        assert recovered["recoveries"][0]["level"] == "InPlace", recovered["recoveries"]
        assert recovered.get("restarts", 0) == 0 and pod_uids() == before  # no pod replaced
        # the operator has seen the restarted process take its first step after the checkpoint, and that process
        # has trained past its earlier high-water mark, so the second kill's lost steps are its own (the in-place
        # recovery then ends at the second failure if the operator has not read its catching up yet)
        wait("not caught up", lambda s: (s.get("goodput") or {}).get("inPlaceRestarts") == 1 and
             "checkpointLoad" in (s.get("recoveries") or [{}])[0].get("seconds", {}) and
             _past_high_water(cluster, "inplace-0-0"), 200)
        os.kill(_worker_pid(cluster, "default", "inplace-1-0"), signal.SIGKILL)  # in-place restarts used up
        final = wait("did not finish", lambda s: s.get("phase") in ("Succeeded", "Failed"), 400)
        twin = wait("twin did not finish", lambda s: s.get("phase") in ("Succeeded", "Failed"), 400, "twin")
        events = _kubectl(cluster, "get", "events", "--field-selector", "involvedObject.name=inplace")
        losses = _losses(cluster, ["inplace-0-0", "inplace-0-1"])
        reference = _losses(cluster, ["twin-0-0"])
        resources.close()

    print(json.dumps({"recoveries": final.get("recoveries"), "goodput": final.get("goodput"),
                      "twin": twin.get("goodput")}, indent=1))  # the figures docs/faults.md quotes (pytest -s)
    assert final["phase"] == "Succeeded" and twin["phase"] == "Succeeded", (final, twin)
    levels = [(r["level"], r["reason"]) for r in final["recoveries"]]
    assert levels == [("InPlace", "WorkerFailed"), ("Replace", "InPlaceRecoveryExhausted")], final["recoveries"]
    assert final["restarts"] == 1 and twin.get("restarts", 0) == 0 and not twin.get("recoveries")
    # the loss curve: every iteration's last value is the twin's, and every step trained again repeated its value
    every = list(range(1, ITERS + 1))
    assert sorted(reference) == every and sorted(losses) == every, (losses, reference)
    assert {i: v[-1] for i, v in losses.items()} == {i: v[-1] for i, v in reference.items()}
    assert all(len(set(v)) == 1 for v in losses.values()), losses
    assert sum(len(v) > 1 for v in losses.values()) >= 2  # the kills did cost steps
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
    assert final["recoveries"][0]["seconds"]["podStart"] < 5  # in place: no pod to schedule
    g = final["goodput"]
    assert abs(g["productiveSeconds"] + g["recoverySeconds"] + g["otherSeconds"] - g["wallSeconds"]) < 0.05, g
    assert 0 < g["goodput"] < 1 and g["otherSeconds"] >= 0 and g["highWaterIteration"] == ITERS, g
    rows = [line.split(None, 4) for line in events.splitlines()[1:]]
    in_place = [row[4] for row in rows if row[2] == "RecoveredInPlace"]
    assert len(in_place) == 1 and in_place[0].startswith("in-place restart 1/1: ") and \
        "pod index 1 local rank 0 killed by SIGKILL" in in_place[0], events
    assert any(row[2] == "GangRestart" and "recovery level Replace" in row[4] for row in rows), events
