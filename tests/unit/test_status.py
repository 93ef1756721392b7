"""Job status follows the pods: Pending with the scheduler's reason, Running, Succeeded, Failed with the exit code."""
from ascend_operator.api.run_policy import RunPolicy
from ascend_operator.status import derive


def pod(index, phase, **status):
    return {"metadata": {"name": f"j-{index}", "labels": {"ascendtrain.dev/replica-index": str(index)}},
            "status": {"phase": phase, **status}}


def ready():
    return {"conditions": [{"type": "Ready", "status": "True"}]}


def test_pending_names_the_waiting_pod_and_reason():
    unschedulable = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                     "message": "0/1 nodes are available: 1 Insufficient huawei.com/Ascend910."}]}
    status = derive([pod(0, "Running", **ready()), pod(1, "Pending", **unschedulable)], 2, {})
    assert status["phase"] == "Pending"
    running = next(c for c in status["conditions"] if c["type"] == "Running")
    assert running["status"] == "False"
    assert "j-1: Unschedulable: 0/1 nodes are available: 1 Insufficient huawei.com/Ascend910." in running["message"]
    assert status["replicas"] == {"active": 2, "ready": 1, "succeeded": 0, "failed": 0}


def test_running_then_succeeded_keeps_start_time_and_sets_completion():
    running = derive([pod(0, "Running", **ready()), pod(1, "Running", **ready())], 2, {"phase": "Pending"})
    assert running["phase"] == "Running" and running["startTime"]
    done = derive([pod(0, "Succeeded"), pod(1, "Succeeded")], 2, running)
    assert done["phase"] == "Succeeded"
    assert done["startTime"] == running["startTime"] and done["completionTime"]
    assert {c["type"]: c["status"] for c in done["conditions"]} == {"Running": "False", "Succeeded": "True"}


def test_failed_pod_reports_exit_code_and_is_terminal():
    failed = pod(1, "Failed", containerStatuses=[{"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}])
    status = derive([pod(0, "Running", **ready()), failed], 2, {"phase": "Running"}, RunPolicy(backoffLimit=0))
    assert status["phase"] == "Failed"
    cond = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert cond["reason"] == "BackoffLimitExceeded"
    assert cond["message"] == "pod j-1 failed: exit code 137 (OOMKilled); runPolicy.backoffLimit (0) restarts used"
    # A terminal job does not come back to life when pods change afterwards.
    assert derive([pod(0, "Running"), pod(1, "Running")], 2, status)["phase"] == "Failed"


def test_condition_transition_time_moves_only_on_flip():
    first = derive([pod(0, "Running", **ready())], 1, {})
    again = derive([pod(0, "Running", **ready())], 1, first)
    t1 = next(c for c in first["conditions"] if c["type"] == "Running")["lastTransitionTime"]
    t2 = next(c for c in again["conditions"] if c["type"] == "Running")["lastTransitionTime"]
    assert t1 == t2


def test_a_preempted_pod_restarts_the_gang_whatever_torchrun_exits_with():
    """torchrun exits 1 after a SIGTERM; the engine's report (termination message) says it was preempted and
    saved its step, so the gang restarts and resumes instead of failing as a permanent exit code 1."""
    report = '{"status":"Failed","reason":"Preempted","iteration":37,"checkpoint":"/ckpt/iter_0000037"}'
    preempted = pod(0, "Failed", containerStatuses=[{"state": {"terminated": {
        "exitCode": 1, "reason": "Error", "message": report}}}])
    status = derive([preempted, pod(1, "Running", **ready())], 2, {"phase": "Running"}, RunPolicy(backoffLimit=3))
    assert status["phase"] == "Restarting" and status["restarts"] == 1
    cond = next(c for c in status["conditions"] if c["type"] == "Restarting")
    assert "preempted after iteration 37, checkpoint /ckpt/iter_0000037" in cond["message"]
    plain = pod(0, "Failed", containerStatuses=[{"state": {"terminated": {"exitCode": 1, "reason": "Error"}}}])
    assert derive([plain, pod(1, "Running")], 2, {"phase": "Running"}, RunPolicy(backoffLimit=3))["phase"] == "Failed"
