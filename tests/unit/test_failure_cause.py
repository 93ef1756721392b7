"""Why a pod failed reaches the job's Failed condition: the engine's own error report, or the last exception line
of the log tail the kubelet keeps (FallbackToLogsOnError), never torchrun's ChildFailedError summary."""
from __future__ import annotations

from ascend_engine.cli import main as engine_main
from ascend_operator.api.run_policy import RunPolicy
from ascend_operator.status import derive

TORCHRUN_TAIL = """Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/ascend_engine/train/model_loader.py", line 40, in load
    raise FileNotFoundError(f"config.json missing in {path}")
FileNotFoundError: config.json missing in /models/x
E1123 15:00:01 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 1) local_rank: 0
Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
ascend_engine FAILED
------------------------------------------------------------
Root Cause (first observed failure):
  exitcode  : 1 (pid: 123)
============================================================"""


def failed_pod(message: str) -> dict:
    return {"metadata": {"name": "j-0", "labels": {"ascendtrain.dev/replica-index": "0"}},
            "status": {"phase": "Failed", "containerStatuses": [
                {"state": {"terminated": {"exitCode": 1, "reason": "Error", "message": message}}}]}}


def failed_condition(message: str) -> dict:
    status = derive([failed_pod(message)], 1, {"phase": "Running"}, RunPolicy(backoffLimit=0))
    assert status["phase"] == "Failed"
    return next(c for c in status["conditions"] if c["type"] == "Failed")


def test_the_last_exception_line_of_a_torchrun_log_tail_is_the_cause():
    message = failed_condition(TORCHRUN_TAIL)["message"]
    assert message.startswith("pod j-0 failed: exit code 1 (Error): FileNotFoundError: config.json missing in /models/x")
    assert "ChildFailedError" not in message


def test_the_engines_own_report_is_the_cause(tmp_path, monkeypatch):
    config = tmp_path / "prep.yaml"
    config.write_text("input: /nonexistent/data.jsonl\noutputPrefix: /tmp/x\ntokenizerNameOrPath: /tmp/tok\n")
    termination_log = tmp_path / "termination-log"
    monkeypatch.setenv("ASCEND_TERMINATION_LOG", str(termination_log))
    monkeypatch.setattr("ascend_engine.telemetry._REPORTED", False)  # a fresh process has reported nothing
    assert engine_main(["preprocess", "--config", str(config)]) == 2
    message = failed_condition(termination_log.read_text())["message"]
    assert "exit code 1 (Error): input: /nonexistent/data.jsonl does not exist" in message


def test_figures_only_add_no_cause():
    message = failed_condition('{"iteration": 3, "loss": 2.5}')["message"]
    assert message.startswith("pod j-0 failed: exit code 1 (Error); permanent")
