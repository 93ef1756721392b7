"""Why a pod failed reaches the job's Failed condition: the engine's own error report, or the last exception line
of the log tail the kubelet keeps (FallbackToLogsOnError), never torchrun's ChildFailedError summary."""
from __future__ import annotations

import subprocess
import sys

from ascend_engine.cli import main as engine_main
from ascend_operator.api.run_policy import RunPolicy
from ascend_operator.lifecycle.status import derive

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


def test_a_trainer_raising_under_torchrun_names_its_exception(tmp_path):
    """A bring-your-own trainer (``progress: none``) raising under a real torchrun: torchrun prefixes the worker's
    lines with ``[rank0]:``, and the cause is still the worker's exception, from the log tail the kubelet keeps."""
    script = tmp_path / "train.py"
    script.write_text("import torch.distributed as dist\n"
                      "dist.init_process_group('gloo')  # from here on torch prefixes uncaught errors with the rank\n"
                      "raise ValueError('bad batch 7')\n")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", str(script)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    tail = "\n".join((run.stdout + run.stderr).splitlines()[-80:])  # FallbackToLogsOnError keeps the last lines
    assert "[rank0]: ValueError: bad batch 7" in tail, tail
    message = failed_condition(tail)["message"]
    assert message.startswith("pod j-0 failed: exit code 1 (Error): ValueError: bad batch 7"), message
