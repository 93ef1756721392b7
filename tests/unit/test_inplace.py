"""The in-place rung's small decisions: ranks follow the pod index under the c10d rendezvous, and the launcher's
report when torchrun's restarts ran out (the operator's cue to replace the gang) or not."""
from __future__ import annotations

import json
import os

from ascend_engine import agent_watch, inplace
from ascend_operator.api.run_policy import RunPolicy
from ascend_operator.lifecycle.status import _failure


def test_ranks_follow_the_pod_index_whatever_order_the_rendezvous_chose(monkeypatch):
    for name, value in {"TORCHELASTIC_RUN_ID": "j", "NODE_RANK": "2", "LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "1",
                        "RANK": "5", "GROUP_RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    inplace.rank_by_pod()
    assert (os.environ["RANK"], os.environ["GROUP_RANK"], os.environ[inplace.TORCHRUN_RANK_ENV]) == ("9", "2", "5")


def test_exhausted_restarts_are_reported_for_the_operator_to_replace_the_gang(monkeypatch):
    monkeypatch.setenv("NODE_RANK", "1")
    record = {"restarts": 3, "maxRestarts": 3, "exhausted": True,
              "last": {"failures": [{"localRank": 0, "exitCode": -9, "signal": "SIGKILL", "failedAt": 1.0}]}}
    report = agent_watch.exhausted_report(record)
    assert report == {"status": "Failed", "reason": "InPlaceRecoveryExhausted", "permanent": False,
                      "message": "local rank 0 killed by SIGKILL after 3 in-place restart(s) "
                                 "(runPolicy.recovery.inPlaceRestarts 3)",
                      "exitCode": -9, "inPlaceRestarts": 3, "podIndex": 1}
    assert agent_watch.exhausted_report({**record, "exhausted": False}) is None  # a deliberate failure's report stands
    # under spec.topology NODE_RANK follows the placement: the report names the pod by its own index (its name's)
    monkeypatch.setenv("ASCEND_POD_INDEX", "3")
    assert agent_watch.exhausted_report(record)["podIndex"] == 3
    monkeypatch.delenv("ASCEND_POD_INDEX")
    pod = {"metadata": {"name": "j-1-0"}, "status": {"containerStatuses": [{"state": {"terminated": {
        "exitCode": 1, "reason": "Error", "message": json.dumps(report)}}}]}}
    retryable, reason, message = _failure(pod, RunPolicy())
    assert retryable and reason == "InPlaceRecoveryExhausted" and "killed by SIGKILL" in message


def test_the_workers_error_line_is_the_jobs_cause_when_a_level_runs_out_or_the_same_error_repeats():
    """Issue 49's lost cause: the Failed condition (and so its event and `ascend-train get`) names the worker's
    own line, whether the in-place restarts ran out and then backoffLimit did, or the same error came back before a
    step was trained (permanent at once: no restart can fix a layout Megatron refuses)."""
    from ascend_operator.lifecycle.status import derive

    line = "AssertionError: First dimension of the tensor should be divisible by tensor parallel size"

    def failed(report):
        return {"metadata": {"name": "j-0-0", "labels": {"ascendtrain.dev/replica-index": "0"}},
                "status": {"phase": "Failed", "containerStatuses": [{"state": {"terminated": {
                    "exitCode": 1, "reason": "Error", "message": json.dumps(report)}}}]}}

    exhausted = {"status": "Failed", "reason": "InPlaceRecoveryExhausted", "permanent": False, "error": line,
                 "exitCode": 1, "inPlaceRestarts": 3,
                 "message": f"{line} (local rank 0, exit code 1) after 3 in-place restart(s)"}
    status = derive([failed(exhausted)], 1, {"phase": "Running"}, RunPolicy(backoffLimit=0))
    condition = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert condition["reason"] == "BackoffLimitExceeded" and line in condition["message"]
    repeated = {**exhausted, "reason": "RepeatedFailure", "permanent": True,
                "message": f"{line} (local rank 0, exit code 1): the same error as the failure before"}
    status = derive([failed(repeated)], 1, {"phase": "Running"}, RunPolicy(backoffLimit=3))
    condition = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert (status["phase"], status.get("restarts", 0), condition["reason"]) == ("Failed", 0, "RepeatedFailure")
    assert line in condition["message"]
