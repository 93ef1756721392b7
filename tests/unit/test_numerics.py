"""Numerics-aware recovery, the pure parts: which steps are faults, which samples are skipped, what a checkpoint
keeps, the config, and how the operator reads numeric failures (the engine's NumericFault, Megatron's rerun state
machine's exit codes 16 and 17)."""
from __future__ import annotations

import json
import math

import pytest

from ascend_engine.config.train import TrainConfig
from ascend_engine.exception_line import worker_exit_code
from ascend_engine.train.numerics import NumericFault, NumericsState, SkippedWindow, fault_reason, skip_past
from ascend_operator.api.run_policy import RunPolicy
from ascend_operator.faults.failure_cause import numeric_failure
from ascend_operator.lifecycle.status import derive

TORCHRUN_TAIL = """[rank1]: megatron rerun state machine: exiting to re-run iteration 1200
E1126 22:42:24 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: {code}) local_rank: 1
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
pretrain_gpt.py FAILED
------------------------------------------------------------
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 24103)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : {code} (pid: 24104)
============================================================"""


def test_non_finite_loss_or_grad_norm_is_a_fault_at_once():
    assert fault_reason(math.nan, 1.0, [], 3.0, 20) == "lm loss is nan"
    assert fault_reason(math.inf, 1.0, [], 0.0, 20) == "lm loss is inf"
    assert fault_reason(2.0, math.nan, [], 0.0, 20) == "grad norm is nan"
    assert fault_reason(2.0, -math.inf, [], 0.0, 20) == "grad norm is -inf"
    assert fault_reason(2.0, None, [], 3.0, 20) is None  # fp16 skipped the step: no norm, no fault


def test_a_spike_is_over_the_factor_times_the_recent_median_and_a_whole_nat_above_it():
    recent = [9.0, 9.0] + [2.0, 2.1, 1.9, 2.0]  # only the last 4 count
    assert fault_reason(6.5, 1.0, recent, 3.0, 4).startswith("loss spike: lm loss 6.5 is 3.2 x the median 2")
    assert fault_reason(5.9, 1.0, recent, 3.0, 4) is None  # under 3 x 2.0
    assert fault_reason(6.5, 1.0, recent[-3:], 3.0, 4) is None  # the window is not full yet
    # a long window starts after 5 steps, over the steps there are
    assert fault_reason(6.5, 1.0, [2.0] * 4, 3.0, 20) is None
    assert "the median 2 of the last 5 steps" in fault_reason(6.5, 1.0, [2.0] * 5, 3.0, 20)
    assert fault_reason(6.5, 1.0, recent, 0.0, 4) is None  # spike detection off
    # a memorised pattern's near-zero losses wobble by large factors: under a nat above the median it is no spike
    assert fault_reason(0.05, 1.0, [0.01] * 4, 3.0, 4) is None
    assert fault_reason(1.2, 1.0, [0.01] * 4, 3.0, 4) is not None


def test_the_data_position_jumps_past_skipped_windows_even_back_to_back():
    windows = [SkippedWindow(11, 40, 44, "spike"), SkippedWindow(12, 44, 48, "spike"), SkippedWindow(30, 96, 100, "")]
    assert [skip_past(c, windows) for c in (36, 40, 42, 44, 48, 96, 99, 100)] == [36, 48, 48, 48, 48, 100, 100, 100]
    assert skip_past(40, []) == 40


def test_a_rollback_forgets_the_abandoned_losses_and_the_record_survives_a_checkpoint():
    state = NumericsState(keep=3)
    for i, loss in enumerate([5.0, 4.0, 3.0, 2.0, 1.5], start=1):
        state.good_step(i, loss)
    assert state.recent() == [3.0, 2.0, 1.5]  # the window's worth
    state.rolled_back(4, SkippedWindow(6, 20, 24, "loss spike"))
    assert state.recent() == [3.0, 2.0] and state.rollbacks == 1 and state.skipped_samples == 4
    assert state.figures() == {"numericRollbacks": 1, "skippedSamples": 4, "skippedWindowIteration": 6,
                               "skippedWindowFirstSample": 20, "skippedWindowEndSample": 24}
    saved = json.loads(json.dumps(state.state_dict()))  # plain data in the checkpoint
    restored = NumericsState(keep=3)
    restored.load_state_dict(saved)
    assert restored == state


def test_the_fault_reports_iteration_and_samples():
    fault = NumericFault("numeric fault at iteration 18", 18, 72, 76)
    assert fault.report() == {"iteration": 18, "samples": [72, 76]}


def test_config_defaults_flags_and_bounds():
    n = TrainConfig().numerics
    assert (n.maxRollbacks, n.lossSpikeFactor, n.lossSpikeWindow) == (3, 3.0, 20)
    assert TrainConfig.model_validate({"numerics": {"lossSpikeFactor": 0}}).numerics.lossSpikeFactor == 0
    with pytest.raises(ValueError, match="lossSpikeFactor .* must be over 1"):
        TrainConfig.model_validate({"numerics": {"lossSpikeFactor": 0.5}})
    with pytest.raises(ValueError):
        TrainConfig.model_validate({"numerics": {"maxRollbacks": -1}})


def test_config_flags_parse():
    import argparse

    from ascend_engine.train.command import add_arguments, load_config

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = load_config(parser.parse_args(["--numerics-max-rollbacks", "0", "--numerics-loss-spike-factor", "4",
                                         "--numerics-loss-spike-window", "8"]))
    assert (cfg.numerics.maxRollbacks, cfg.numerics.lossSpikeFactor, cfg.numerics.lossSpikeWindow) == (0, 4.0, 8)


def test_torchruns_summary_names_the_root_cause_workers_exit_code():
    assert worker_exit_code(TORCHRUN_TAIL.format(code=16)) == 16
    assert worker_exit_code("  exitcode  : 1 (pid: 5)") == 1
    assert worker_exit_code("ValueError: x") is None and worker_exit_code(None) is None


def test_numeric_failures_from_the_engine_report_and_megatrons_exit_codes():
    report = {"status": "Failed", "reason": "NumericFault", "message": "numeric fault at iteration 18 (...)",
              "iteration": 18, "samples": [72, 76]}
    assert numeric_failure(1, report, json.dumps(report)) == (False, "NumericFault", report["message"])
    assert numeric_failure(17, {}, None)[:2] == (False, "NumericFault")
    assert numeric_failure(16, {}, None)[:2] == (True, "RerunRequested")
    # torchrun exits 1: the worker's code is in the log tail, or in `ascend-engine watch`'s report
    assert numeric_failure(1, {}, TORCHRUN_TAIL.format(code=17))[:2] == (False, "NumericFault")
    assert numeric_failure(1, {"status": "Failed", "reason": "TrainerFailed", "workerExitCode": 16}, "{}")[:2] == \
        (True, "RerunRequested")
    assert numeric_failure(1, {}, TORCHRUN_TAIL.format(code=1)) is None
    assert numeric_failure(3, {"status": "Failed", "reason": "DataError"}, "{}") is None


def failed_pod(code: int, message: str = "", index: int = 0) -> dict:
    return {"metadata": {"name": f"j-{index}", "labels": {"ascendtrain.dev/replica-index": str(index)}},
            "status": {"phase": "Failed", "containerStatuses": [
                {"state": {"terminated": {"exitCode": code, "reason": "Error", "message": message}}}]}}


def test_exit_16_restarts_the_gang_without_using_the_backoff_limit_and_17_fails_for_good():
    status = derive([failed_pod(1, TORCHRUN_TAIL.format(code=16)), failed_pod(1, "", 1)], 2, {"phase": "Running"},
                    RunPolicy(backoffLimit=0))
    restarting = next(c for c in status["conditions"] if c["type"] == "Restarting")
    assert status["phase"] == "Restarting" and status["restarts"] == 1 and status["disruptions"] == 1
    assert restarting["reason"] == "RerunRequested" and "rerun state machine" in restarting["message"]

    status = derive([failed_pod(17)], 1, {"phase": "Running"}, RunPolicy(backoffLimit=3, retryableExitCodes=[17]))
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert status["phase"] == "Failed" and failed["reason"] == "NumericFault"
    assert failed["message"].startswith("pod j-0 failed: exit code 17 (Error): exit code 17: Megatron's rerun")


def test_the_engines_numeric_fault_fails_the_job_naming_iteration_and_samples():
    report = {"status": "Failed", "reason": "NumericFault", "iteration": 18, "samples": [72, 76],
              "message": "numeric fault at iteration 18 (samples 72-75 of the run): loss spike: ...; "
                         "numerics.maxRollbacks (1) rollbacks used"}
    status = derive([failed_pod(1, json.dumps(report))], 1, {"phase": "Running"}, RunPolicy(backoffLimit=3))
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert status["phase"] == "Failed" and failed["reason"] == "NumericFault"
    assert "iteration 18 (samples 72-75 of the run)" in failed["message"]


def test_watch_reports_the_torchrun_workers_exit_code_of_a_trainer(tmp_path):
    """A bring-your-own Megatron-LM under torchrun exits 1; `ascend-engine watch` finds the worker's 16 / 17."""
    import os
    import subprocess
    import sys

    script = tmp_path / "trainer.py"
    script.write_text(f"import sys\nsys.stderr.write({TORCHRUN_TAIL.format(code=17)!r} + '\\n')\nsys.exit(1)\n")
    env = {**os.environ, "ASCEND_TERMINATION_LOG": str(tmp_path / "termination-log")}
    env.pop("ASCEND_METRICS_PORT", None)
    proc = subprocess.run([sys.executable, "-m", "ascend_engine.cli", "watch", "--", sys.executable, str(script)],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1
    report = json.loads((tmp_path / "termination-log").read_text())
    assert report["reason"] == "TrainerFailed" and report["workerExitCode"] == 17
    assert numeric_failure(1, report, json.dumps(report))[:2] == (False, "NumericFault")


def test_the_figures_are_metrics_the_operator_reads_into_status_progress():
    from ascend_engine.telemetry import METRIC_NAMES
    from ascend_operator.api.train_job import TrainProgress

    state = NumericsState()
    state.rolled_back(0, SkippedWindow(3, 8, 12, "lm loss is nan"))
    assert set(state.figures()) <= set(METRIC_NAMES.values()) & set(TrainProgress.model_fields)
