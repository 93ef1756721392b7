"""status.recoveries and status.goodput from the operator's decisions and rank 0's figures: each recovery's parts
are the differences of the measured times and add up to its total; the job's wall time is productive + recovery
+ other."""
from __future__ import annotations

from ascend_operator.recovery import goodput
from ascend_operator.recovery.goodput import stamp

T0 = 1_790_000_000.0  # a start time (unix seconds)


def _started(**extra):
    return {"startTime": stamp(T0).split(".")[0] + "Z", "progress": {"iteration": 0}, **extra}


def test_a_replace_recovery_fills_its_parts_as_the_times_become_known_and_they_add_up():
    status = _started(progress={"iteration": 23})
    failed_pod = {"status": {"containerStatuses": [{"state": {"terminated": {"finishedAt": stamp(T0 + 100)}}}]}}
    status = goodput.begin(status, "Replace", "PodFailed", "pod j-1-0 failed", T0 + 102.5, [failed_pod])
    entry = status["recoveries"][-1]
    assert entry["level"] == "Replace" and entry["highWaterIteration"] == 23
    assert entry["seconds"] == {"detection": 2.5}
    status = goodput.old_pods_gone(status, T0 + 110.0)  # the next attempt's pods are created
    assert status["recoveries"][-1]["seconds"]["stopping"] == 7.5
    # the old process still answers (started before the recovery): nothing is filled from it
    old = goodput.fold({**status, "progress": {"iteration": 23, "processStartTime": T0 + 1}}, T0 + 111)
    assert set(old["recoveries"][-1]["seconds"]) == {"detection", "stopping"}
    new_process = {"processStartTime": T0 + 125.0, "joinedTime": T0 + 140.0, "firstStepTime": T0 + 146.0,
                   "loadedIteration": 20, "productiveSeconds": 60.0}
    status = goodput.fold({**status, "progress": {"iteration": 21, **new_process}}, T0 + 150)
    entry = status["recoveries"][-1]
    assert entry["seconds"] == {"detection": 2.5, "stopping": 7.5, "podStart": 15.0, "rendezvous": 15.0,
                                "checkpointLoad": 6.0}
    assert entry["fromIteration"] == 20 and entry["lostIterations"] == 3 and "totalSeconds" not in entry
    assert "processStartTime" not in status["progress"]  # moved out of progress
    status = goodput.fold({**status, "progress": {"iteration": 25, **new_process, "caughtUpTime": T0 + 152.0,
                                                   "productiveSeconds": 61.0}}, T0 + 160)
    entry = status["recoveries"][-1]
    assert entry["seconds"]["retrain"] == 6.0 and entry["totalSeconds"] == 52.0
    assert abs(sum(entry["seconds"].values()) - entry["totalSeconds"]) < 1e-6
    g = status["goodput"]
    assert g["wallSeconds"] == 160.0 and g["recoverySeconds"] == 52.0 and g["productiveSeconds"] == 61.0
    assert g["otherSeconds"] == 47.0 and g["goodput"] == round(61 / 160, 4) and g["highWaterIteration"] == 25


def test_an_in_place_restart_is_opened_from_rank_0s_figures_once():
    status = _started(progress={"iteration": 14}, goodput={"inPlaceRestarts": 0, "highWaterIteration": 14})
    figures = {"inPlaceRestarts": 1, "failedTime": T0 + 50.0, "detectedTime": T0 + 50.4, "stoppedTime": T0 + 50.6,
               "processStartTime": T0 + 50.7, "joinedTime": T0 + 60.7, "firstStepTime": T0 + 62.0,
               "loadedIteration": 10, "productiveSeconds": 30.0}
    status = goodput.fold({**status, "progress": {"iteration": 11, **figures}}, T0 + 63)
    status = goodput.fold({**status, "progress": {"iteration": 12, **figures}}, T0 + 64)  # read again: no second
    assert [r["level"] for r in status["recoveries"]] == ["InPlace"]
    entry = status["recoveries"][0]
    assert entry["seconds"] == {"detection": 0.4, "stopping": 0.2, "podStart": 0.1, "rendezvous": 10.0,
                                "checkpointLoad": 1.3}
    assert entry["lostIterations"] == 4 and status["goodput"]["inPlaceRestarts"] == 1
    # a replaced gang's new pods report no restarts: the count starts again, and their first one is seen
    status = goodput.fold({**status, "progress": {"iteration": 15, **figures, "inPlaceRestarts": 0,
                                                   "processStartTime": T0 + 90}}, T0 + 95)
    assert status["goodput"]["inPlaceRestarts"] == 0


def test_productive_seconds_carry_over_a_process_that_could_not_keep_them():
    status = _started()
    status = goodput.fold({**status, "progress": {"processStartTime": T0 + 1, "productiveSeconds": 40.0}}, T0 + 50)
    # no checkpoint.save: the next process counts from 0 again; the operator keeps the earlier 40 s
    status = goodput.fold({**status, "progress": {"processStartTime": T0 + 60, "productiveSeconds": 5.0}}, T0 + 70)
    assert status["goodput"]["productiveSeconds"] == 45.0
    status = goodput.fold({**status, "progress": {"processStartTime": T0 + 60, "productiveSeconds": 9.0}}, T0 + 75)
    assert status["goodput"]["productiveSeconds"] == 49.0


def test_steps_trained_after_the_operators_last_reading_count_as_lost():
    """The operator read iteration 23 before the pod failed; the engine's own record beside the checkpoints says
    the old process reached 26: resumed from 20, six steps are trained again, not three."""
    status = goodput.begin(_started(progress={"iteration": 23}), "Replace", "PodFailed", "pod j-1-0 failed", T0 + 100)
    status = goodput.old_pods_gone(status, T0 + 105.0)
    new_process = {"processStartTime": T0 + 110.0, "joinedTime": T0 + 115.0, "firstStepTime": T0 + 117.0,
                   "loadedIteration": 20, "priorHighWaterIteration": 26}
    entry = goodput.fold({**status, "progress": {"iteration": 21, **new_process}}, T0 + 118)["recoveries"][-1]
    assert entry["highWaterIteration"] == 26 and entry["fromIteration"] == 20 and entry["lostIterations"] == 6


def test_an_in_place_restart_first_read_past_its_checkpoint_counts_the_old_processs_steps():
    """The operator first reads the restarted process at iteration 27; the old one reached 19 and the new one
    resumed from 15: four steps trained again, not twelve."""
    status = _started(progress={"iteration": 18}, goodput={"inPlaceRestarts": 0, "highWaterIteration": 18})
    figures = {"inPlaceRestarts": 1, "failedTime": T0 + 50.0, "processStartTime": T0 + 50.7,
               "joinedTime": T0 + 60.7, "firstStepTime": T0 + 62.0, "loadedIteration": 15,
               "priorHighWaterIteration": 19}
    entry = goodput.fold({**status, "progress": {"iteration": 27, **figures}}, T0 + 70)["recoveries"][-1]
    assert entry["level"] == "InPlace" and entry["highWaterIteration"] == 19 and entry["lostIterations"] == 4


def test_a_recovery_cut_short_by_the_next_failure_ends_at_it_and_is_not_counted_twice():
    """An in-place restart had loaded its checkpoint and was training its lost steps again when the next failure
    came: it ends at that failure, its retrain part taking the rest, and the job's recovery seconds are the two
    recoveries back to back, not overlapping."""
    status = _started(progress={"iteration": 25}, goodput={"inPlaceRestarts": 0, "highWaterIteration": 25})
    figures = {"inPlaceRestarts": 1, "failedTime": T0 + 50.0, "detectedTime": T0 + 51.0, "stoppedTime": T0 + 53.0,
               "processStartTime": T0 + 54.0, "joinedTime": T0 + 70.0, "firstStepTime": T0 + 73.0,
               "loadedIteration": 20}
    status = goodput.fold({**status, "progress": {"iteration": 23, **figures}}, T0 + 75)
    assert status["recoveries"][0].get("totalSeconds") is None  # still training its lost steps again
    failed_pod = {"status": {"containerStatuses": [{"state": {"terminated": {"finishedAt": stamp(T0 + 80)}}}]}}
    status = goodput.begin(status, "Replace", "InPlaceRecoveryExhausted", "pod j-1-0 failed", T0 + 81.0,
                           [failed_pod])
    first = status["recoveries"][0]
    assert first["totalSeconds"] == 30.0 and first["seconds"]["retrain"] == 7.0
    assert abs(sum(first["seconds"].values()) - first["totalSeconds"]) < 1e-6
    g = goodput.fold(status, T0 + 90)["goodput"]
    assert g["recoverySeconds"] == 30.0 + 10.0  # the open Replace: from its failure (T0 + 80) to now


def test_an_in_process_restart_is_one_recovery_from_rank_0s_marks_and_a_new_attempt_counts_from_zero():
    """Rank 0 reports the whole in-process restart at its first step after it (every mark but the catch-up), then
    the catch-up: one InProcess recovery whose parts add up; the survivor's process start is old, so nothing is
    taken for an in-place restart; the count is the attempt's, so after a gang restart 1 is a new one again."""
    status = _started(progress={"iteration": 14, "processStartTime": T0 + 1.0},
                      goodput={"inPlaceRestarts": 0, "inProcessRestarts": 0, "highWaterIteration": 14})
    marks = {"inProcessRestarts": 1, "inProcessFailedTime": T0 + 50.0, "inProcessDetectedTime": T0 + 50.1,
             "inProcessStoppedTime": T0 + 50.5, "inProcessRejoinedTime": T0 + 50.6, "inProcessJoinedTime": T0 + 50.8,
             "inProcessFirstStepTime": T0 + 51.8, "inProcessLoadedIteration": 10,
             "inProcessHighWaterIteration": 14, "inProcessSpares": 1, "inProcessFromMemory": 1}
    status = goodput.fold({**status, "progress": {"iteration": 11, "processStartTime": T0 + 1.0, **marks}}, T0 + 52)
    [entry] = status["recoveries"]
    assert (entry["level"], entry["reason"], entry["fromIteration"], entry["lostIterations"]) == \
        ("InProcess", "WorkerFailed", 10, 4)
    assert entry["seconds"] == {"detection": 0.1, "stopping": 0.4, "podStart": 0.1, "rendezvous": 0.2,
                                "checkpointLoad": 1.0}
    assert "1 warm spare(s)" in entry["message"] and "host memory" in entry["message"]
    assert "totalSeconds" not in entry and status["goodput"]["inProcessRestarts"] == 1
    status = goodput.fold({**status, "progress": {"iteration": 15, "processStartTime": T0 + 1.0, **marks,
                                                   "inProcessCaughtUpTime": T0 + 53.0}}, T0 + 54)
    [entry] = status["recoveries"]
    assert entry["seconds"]["retrain"] == 1.2 and entry["totalSeconds"] == 3.0
    assert abs(sum(entry["seconds"].values()) - entry["totalSeconds"]) < 1e-6
    assert status["goodput"]["recoverySeconds"] == 3.0
    # read again: still one recovery
    again = goodput.fold({**status, "progress": {"iteration": 16, **marks, "inProcessCaughtUpTime": T0 + 53.0}},
                         T0 + 55)
    assert len(again["recoveries"]) == 1
    # a gang restart's new attempt reports 0, then its own first in-process restart is new
    fresh = goodput.fold({**again, "progress": {"iteration": 16, "processStartTime": T0 + 70.0,
                                                 "inProcessRestarts": 0}}, T0 + 71)
    assert fresh["goodput"]["inProcessRestarts"] == 0
    later = {**marks, "inProcessFailedTime": T0 + 80.0, "inProcessDetectedTime": T0 + 80.2,
             "inProcessStoppedTime": T0 + 80.4, "inProcessRejoinedTime": T0 + 80.5, "inProcessJoinedTime": T0 + 80.6,
             "inProcessFirstStepTime": T0 + 81.0}
    after = goodput.fold({**fresh, "progress": {"iteration": 17, "processStartTime": T0 + 70.0, **later}}, T0 + 82)
    assert [r["level"] for r in after["recoveries"]] == ["InProcess", "InProcess"]
