"""Job status follows the pods: Pending with the scheduler's reason, Running, Succeeded, Failed with the exit code."""
from ascend_operator.api.group import POD_FINALIZER
from ascend_operator.api.run_policy import RunPolicy
from ascend_operator.lifecycle.status import derive


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


def test_preemption_and_eviction_restart_the_gang_without_using_the_backoff_limit():
    """As a Job's podFailurePolicy with DisruptionTarget -> Ignore: the cluster took the pod away."""
    no_retries = RunPolicy(backoffLimit=0)
    evicted = pod(1, "Failed", reason="Evicted", message="The node was low on resource: memory.",
                  conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
                               "message": "The node was low on resource: memory."}],
                  containerStatuses=[{"state": {"terminated": {"exitCode": 137, "reason": "Error"}}}])
    first = derive([pod(0, "Running", **ready()), evicted], 2, {"phase": "Running"}, no_retries)
    assert (first["phase"], first["restarts"], first["disruptions"]) == ("Restarting", 1, 1)
    restarting = next(c for c in first["conditions"] if c["type"] == "Restarting")
    assert restarting["reason"] == "PodDisrupted" and "not counted against runPolicy.backoffLimit" in \
        restarting["message"] and "TerminationByKubelet" in restarting["message"]
    # Pod 0 is being deleted by the scheduler's preemption: on its way out, with its reason.
    preempted = pod(0, "Running", conditions=[{"type": "DisruptionTarget", "status": "True",
                                               "reason": "PreemptionByScheduler", "message": "by prio/high"}])
    preempted["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    preempted["metadata"]["finalizers"] = [POD_FINALIZER]  # its end not counted yet
    created = {"type": "Created", "status": "True", "reason": "Created", "message": "", "lastTransitionTime": "t"}
    running = {**first, "phase": "Running", "conditions": first["conditions"] + [created]}
    second = derive([preempted, pod(1, "Running", **ready())], 2, running, no_retries)
    assert (second["phase"], second["restarts"], second["disruptions"]) == ("Restarting", 2, 2)
    # A real failure still counts: backoffLimit 0 leaves none.
    crashed = pod(1, "Failed", containerStatuses=[{"state": {"terminated": {"exitCode": 137, "reason": "Error"}}}])
    third = derive([pod(0, "Running", **ready()), crashed], 2, {**second, "phase": "Running"}, no_retries)
    assert third["phase"] == "Failed"
