"""The in-place rung's cause and count, without processes: a worker's error line reaches its torchrun agent through
the error file (torch's own reader parses it), a worker says it has trained a step, and the job's count in the
rendezvous store counts a round's failure once however many agents see one."""
from __future__ import annotations

import json
from types import SimpleNamespace

from ascend_engine import agent_watch, inplace, telemetry

LINE = "AssertionError: First dimension of the tensor should be divisible by tensor parallel size"


def test_the_error_line_is_the_messages_first_line_with_its_reason_in_front():
    assert inplace.error_line("AssertionError", LINE) == LINE
    assert inplace.error_line("DataError", "bad training data: no dataset\nmore") == \
        "DataError: bad training data: no dataset"
    assert inplace.error_line("InvalidConfig", "\ntraining.seqLength: must be > 0\n") == \
        "InvalidConfig: training.seqLength: must be > 0"
    assert inplace.error_line("NoFiniteLoss", "") == "NoFiniteLoss"
    assert len(inplace.error_line("ValueError", "ValueError: " + "x" * 5000)) == inplace.MAX_LINE


def test_a_failure_report_reaches_the_agent_through_torchruns_error_file(tmp_path, monkeypatch):
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    error_file = tmp_path / "error.json"
    monkeypatch.setenv(inplace.ERROR_FILE_ENV, str(error_file))
    monkeypatch.setenv(telemetry.TERMINATION_LOG_ENV, str(tmp_path / "termination-log"))
    monkeypatch.setattr(telemetry, "_REPORTED", True)  # a report written before stays; the error file is written
    try:
        raise AssertionError(LINE.split(": ", 1)[1] + "\nand a second line")
    except AssertionError as e:
        telemetry.report_failure(type(e).__name__, f"{type(e).__name__}: {e}")  # what cli.main does
    failure = ProcessFailure(local_rank=1, pid=123, exitcode=1, error_file=str(error_file))
    assert failure.message["message"] == LINE and "Traceback" in failure.message["extraInfo"]["py_callstack"]
    assert agent_watch._failure(failure) == {"localRank": 1, "exitCode": 1, "failedAt": float(failure.timestamp),
                                         "signal": None, "error": LINE}
    assert not (tmp_path / "termination-log").exists()

    killed = ProcessFailure(local_rank=0, pid=124, exitcode=-9, error_file=str(tmp_path / "none.json"))
    assert agent_watch._failure(killed)["error"] is None and agent_watch._failure(killed)["signal"] == "SIGKILL"
    assert agent_watch.describe(agent_watch._failure(killed)) == "local rank 0 killed by SIGKILL"
    assert agent_watch.describe(agent_watch._failure(failure)) == f"{LINE} (local rank 1, exit code 1)"


def test_outside_torchrun_no_error_file_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(inplace.ERROR_FILE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    inplace.record_worker_error(LINE)
    monkeypatch.setenv(inplace.ERROR_FILE_ENV, "")  # torchrun's value when it keeps no logs
    inplace.record_worker_error(LINE)
    assert list(tmp_path.iterdir()) == []


def test_a_worker_says_once_that_it_trained_a_step(tmp_path, monkeypatch):
    monkeypatch.setenv(inplace.RECORD_ENV, str(tmp_path / "record.json"))
    monkeypatch.setattr(inplace, "_TRAINED", False)
    inplace.trained_a_step(7)
    said = json.loads((tmp_path / inplace.TRAINED_FILE).read_text())
    (tmp_path / inplace.TRAINED_FILE).unlink()  # the agent took it at a failure
    inplace.trained_a_step(8)  # the same process: it has said it
    assert said["iteration"] == 7 and not (tmp_path / inplace.TRAINED_FILE).exists()


def test_a_rounds_failure_is_counted_once_however_many_pods_see_it():
    import torch.distributed as dist

    store = dist.HashStore()  # stands for the rendezvous backend's store, under this round's prefix
    group = SimpleNamespace(store=dist.PrefixStore("torch.rendezvous.job.3", store),
                            spec=SimpleNamespace(rdzv_handler=SimpleNamespace(get_run_id=lambda: "job")))
    pod0, pod1 = agent_watch.JobCount(group), agent_watch.JobCount(group)
    assert pod0.current() == 0
    assert pod0.failed(0) == 1 and pod1.failed(0) == 1  # pod 1's worker failed because pod 0's did
    assert pod1.current() == 1  # what a pod restarted without a failure of its own reads
    assert pod1.failed(1) == 2 and pod0.current() == 2
    assert pod0.given_up(2) is None
    pod1.give_up(2, {"reason": "InPlaceRecoveryExhausted", "message": "m"})
    assert pod0.given_up(2) == {"reason": "InPlaceRecoveryExhausted", "message": "m"}
    assert store.check(["ascend.inplace.job.restarts"])  # the job's keys beside torch's, not in one round's prefix


def test_a_report_from_the_record_names_the_first_worker_that_left_a_line():
    """An exhausted record without a report of its own (the launcher's fallback): the cause is the failure with an
    error line, not the earlier kill of a peer that carries none."""
    record = {"restarts": 1, "maxRestarts": 3, "exhausted": True, "last": {"failures": [
        {"localRank": 0, "exitCode": 1, "signal": None, "failedAt": 2.0, "error": LINE},
        {"localRank": 1, "exitCode": -9, "signal": "SIGKILL", "failedAt": 1.0, "error": None}]}}
    report = agent_watch.exhausted_report(record)
    assert report["message"] == (f"{LINE} (local rank 0, exit code 1) after 1 in-place restart(s) "
                                 "(runPolicy.recovery.inPlaceRestarts 3)")
    assert (report["error"], report["exitCode"], report["permanent"], report["inPlaceRestarts"]) == (LINE, 1, False, 1)
