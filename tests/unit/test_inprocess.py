"""The in-process level's pieces that need no second process: the decision in the store (one per generation, the
job's count, the bound), where a rank's checkpoint files are replicated, the words and parts rank 0 reports, and
how a warm spare finds the job's device and runs a worker's command."""
from __future__ import annotations

import json
import sys
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from ascend_engine.checkpoint.memory import peer_of
from ascend_engine.inprocess import Coordinator, Session, describe, peer_failure
from ascend_engine.spare import become, device_of


@pytest.fixture
def store():
    return TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)


def test_the_first_claim_decides_for_its_generation_and_the_count_bounds_restarts(store):
    a, b = Coordinator(store, "job", 0), Coordinator(store, "job", 0)
    first = a.claim(0, {"rank": 1, "error": "RuntimeError: boom", "failedAt": 1.0}, limit_=2)
    assert (first["restart"], first["generation"], first["restarts"]) == (True, 1, 1)
    # a second claimant of the same generation (a peer, an agent) gets the same decision, and counts nothing
    assert b.claim(0, {"rank": 0, "error": "RuntimeError: Connection closed by peer"}, limit_=2) == first
    assert a.count() == 1 and b.decision(0, timeout=1) == first
    second = b.claim(1, {"rank": 0}, limit_=2)
    assert (second["restart"], second["generation"], second["restarts"]) == (True, 2, 2)
    used_up = a.claim(2, {"rank": 1}, limit_=2)
    assert (used_up["restart"], used_up["generation"], a.count()) == (False, 2, 2)
    # a death with no warm spare ready is not restarted in process, whatever the count
    assert Coordinator(store, "job", 1).claim(2, {"rank": 1}, limit_=5, can_restart=False)["restart"] is False
    assert a.decision(7, timeout=0.2) is None  # nobody decided
    assert a.pg_prefix(2) != Coordinator(store, "job", 1).pg_prefix(2)  # a new round, a new group's keys


def test_peers_hold_each_others_files_in_another_pod_when_there_is_one():
    assert [peer_of(r, 4, 2) for r in range(4)] == [2, 3, 0, 1]  # two pods of two: the same local rank, next pod
    assert [peer_of(r, 2, 1) for r in range(2)] == [1, 0]
    assert [peer_of(r, 3, 3) for r in range(3)] == [1, 2, 0]  # one pod: the next rank
    assert peer_of(0, 1, 1) == 0


def test_what_rank_0_says_of_a_restart():
    killed = {"podIndex": 1, "localRank": 0, "signal": "SIGKILL", "exitCode": -9, "error": None}
    assert describe(killed) == "pod index 1 local rank 0 killed by SIGKILL"
    assert describe({"rank": 3, "error": "RuntimeError: boom"}) == "rank 3 raised RuntimeError: boom"
    session = Session.__new__(Session)
    session.limit = 3
    session.restart = {**killed, "restarts": 1, "spares": 1, "fromMemory": True, "failedAt": 10.0,
                       "detectedAt": 10.1, "stoppedAt": 10.5, "rejoinAt": 10.6, "joinedAt": 10.8,
                       "firstStepAt": 11.5, "caughtUpAt": 12.0, "loadedIteration": 10, "highWater": 13}
    assert session.parts() == {"detection": 0.1, "stopping": 0.4, "podStart": 0.1, "rendezvous": 0.2,
                               "checkpointLoad": 0.7, "retrain": 0.5}
    assert session.summary(10) == ("in-process restart 1/3: pod index 1 local rank 0 killed by SIGKILL; 1 warm "
                                   "spare(s) took the place of the dead rank(s), the other ranks restarted in their "
                                   "processes; training resumes from iteration 10 (host memory)")
    figures = session.figures()
    assert figures["inProcessRestarts"] == 1 and figures["inProcessFromMemory"] == 1.0
    assert figures["inProcessLoadedIteration"] == 10 and figures["inProcessCaughtUpTime"] == 12.0


def test_a_collective_broken_by_a_peer_is_told_from_a_failure_of_ones_own():
    assert peer_failure(RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1"))
    assert not peer_failure(RuntimeError("injected fault at iteration 6"))
    assert not peer_failure(AssertionError("First dimension of the tensor should be divisible"))


def test_a_spare_finds_the_jobs_device_and_runs_the_workers_command(tmp_path, monkeypatch):
    config = tmp_path / "job.yaml"
    config.write_text("device: cpu\nmodel: {numLayers: 2}\n")
    assert device_of(["-u", "-m", "ascend_engine", "train", "--config", str(config)]) == "cpu"
    whole = tmp_path / "atj.yaml"
    whole.write_text("kind: AscendTrainJob\nspec:\n  train: {device: npu}\n")
    assert device_of(["-m", "ascend_engine", "train", "--config", str(whole)]) == "npu"
    assert device_of(["x.py", "--device", "cuda"]) == "cuda" and device_of(["x.py"]) == "auto"
    script = tmp_path / "worker.py"
    out = tmp_path / "out.json"
    script.write_text(f"import json, sys\njson.dump(sys.argv[1:], open({str(out)!r}, 'w'))\n")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    become(["-u", str(script), "--dir", "D"])  # torchrun's arguments to the interpreter
    assert json.loads(out.read_text()) == ["--dir", "D"]


def test_parallel_state_torn_down_keeps_no_process_group_alive():
    """An in-process restart tears Megatron-core's groups down and forms them again; a warm spare rehearses a model
    build and waits. Megatron-core's destroy_model_parallel leaves its partial data-parallel groups set: held, each
    kept gloo's loop threads (an idle spare paid 15 ms of CPU a second for 50 of them) and every restart added two."""
    import gc
    import os

    import torch

    from ascend_engine.device import select_backend
    from ascend_engine.parallel import destroy_parallel, init_parallel

    def gloo_threads() -> int:
        return sum("gloo" in open(f"/proc/self/task/{t}/comm").read() for t in os.listdir("/proc/self/task"))

    before = gloo_threads()
    backend = select_backend("cpu")
    backend.apply()
    for _ in range(2):  # as a restart does
        init_parallel(backend, 1, 1, 0, store=torch.distributed.HashStore())
        assert gloo_threads() > before
        destroy_parallel()
        gc.collect()
        assert gloo_threads() == before
