"""What the reconcile does with a job's pods once its status is written (``lifecycle.pod_ends``): which pods go,
which are created, and which lose the operator's finalizer (their end counted, never before)."""
import datetime as dt

from ascend_operator.api.group import POD_FINALIZER
from ascend_operator.api.run_policy import RunPolicy
from ascend_operator.cache.job_pods import JobPods
from ascend_operator.lifecycle import pod_ends

NOW = dt.datetime(2026, 1, 1, 0, 5, tzinfo=dt.timezone.utc)


def pod(i, attempt=0, phase="Running", deleting=False, held=True, node="n1", ran=None, fault=None, grace=30):
    meta = {"name": f"j-{i}-{attempt}", "uid": f"uid-{i}-{attempt}", "resourceVersion": "1",
            "labels": {"ascendtrain.dev/job-name": "j", "ascendtrain.dev/job-kind": "AscendTrainJob",
                       "ascendtrain.dev/replica-index": str(i), "ascendtrain.dev/attempt": str(attempt)}}
    if held:
        meta["finalizers"] = [POD_FINALIZER]
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:04:50Z"
        meta["deletionGracePeriodSeconds"] = grace
    status = {"phase": phase}
    if ran or (ran is None and phase != "Pending"):
        status["containerStatuses"] = [{"state": {"running": {}} if phase in ("Pending", "Running") else
                                        {"terminated": {"exitCode": 0 if phase == "Succeeded" else 1}}}]
    if fault:
        status["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": fault}]
    p = {"metadata": meta, "status": status}
    if node:
        p["spec"] = {"nodeName": node}
    return p


def names(pods):
    return sorted(p["metadata"]["name"] for p in pods)


def test_a_finished_job_releases_every_pod_it_holds():
    pods = JobPods([pod(0, phase="Succeeded"), pod(1, phase="Running"), pod(2, attempt=1, deleting=True),
                    pod(3, held=False)])
    assert names(pod_ends.releasable(pods, 1, terminal=True, suspended=False, now=NOW)) == ["j-0-0", "j-1-0", "j-2-1"]


def test_older_attempts_release_what_ended_or_is_going_and_keep_a_pod_still_running_until_deleted():
    pods = JobPods([pod(0, phase="Failed"), pod(1, deleting=True), pod(2), pod(0, attempt=1)])
    assert names(pod_ends.releasable(pods, 1, terminal=False, suspended=False, now=NOW)) == ["j-0-0", "j-1-0"]


def test_the_current_attempt_releases_only_pods_deleted_before_they_ran():
    """A pod deleted after it ran is a fault the status counts by starting a new attempt (then it is an older
    attempt's); one deleted before it ran is replaced under its name once it is gone, and counts nothing."""
    pods = JobPods([pod(0, attempt=2, phase="Pending", ran=False, deleting=True),
                    pod(1, attempt=2, deleting=True), pod(2, attempt=2)])
    assert names(pod_ends.releasable(pods, 2, terminal=False, suspended=False, now=NOW)) == ["j-0-2"]
    assert names(pod_ends.replaced(pods, 2, suspended=False)) == ["j-0-2"]


def test_a_suspended_gang_is_released_once_its_last_status_is_in():
    """The pods stopped by a suspension keep the finalizer until their end is reported (the checkpoint rank 0 saved
    on SIGTERM is in its final report), or can never be: no node, a lost node, a forced deletion, a long-gone
    grace period."""
    stopping = pod(0, deleting=True)
    pods = JobPods([stopping, pod(1, phase="Failed", deleting=True), pod(2, deleting=True, node=None),
                    pod(3, deleting=True, fault="DeletionByTaintManager"), pod(4, deleting=True, grace=0)])
    assert names(pod_ends.releasable(pods, 0, terminal=False, suspended=True, now=NOW)) == [
        "j-1-0", "j-2-0", "j-3-0", "j-4-0"]
    late = NOW + dt.timedelta(seconds=30 + pod_ends.UNCONFIRMED_GRACE_S)
    assert "j-0-0" in names(pod_ends.releasable(JobPods([stopping]), 0, False, True, now=late))


def test_doomed_pods_whatever_the_phase():
    policy = RunPolicy(backoffLimit=1)  # two attempts kept: the current one and the one before
    pods = JobPods([pod(0, attempt=0, phase="Failed"), pod(1, attempt=1, phase="Failed"), pod(0, attempt=1),
                    pod(0, attempt=2, phase="Pending"), pod(1, attempt=2), pod(0, attempt=3)])
    assert names(pod_ends.doomed(pods, 2, policy, suspended=False, terminal=False)) == [
        "j-0-0", "j-0-1", "j-0-3"]  # too old; still running in an older attempt; of an attempt the status lacks
    assert names(pod_ends.doomed(pods, 2, policy, suspended=True, terminal=False)) == [
        "j-0-0", "j-0-1", "j-0-2", "j-0-3", "j-1-2"]
    assert names(pod_ends.doomed(pods, 2, RunPolicy(cleanPodPolicy="Running"), False, terminal=True)) == [
        "j-0-1", "j-0-2", "j-0-3", "j-1-2"]


def test_a_new_gang_waits_until_nothing_of_the_old_one_may_run():
    pods = JobPods([pod(0, attempt=0, phase="Failed"), pod(1, attempt=0, deleting=True), pod(0, attempt=1,
                                                                                            phase="Pending")])
    assert "1 pod(s) of the previous attempt" in pod_ends.blocking(pods, 1, resuming=False)
    assert pod_ends.blocking(JobPods([pod(0, attempt=0, phase="Failed"), pod(0, attempt=1)]), 1, False) is None
    assert "stopped by the suspension" in pod_ends.blocking(JobPods([pod(0, deleting=True)]), 0, resuming=True)


def test_missing_indices_of_the_current_attempt():
    current = JobPods([pod(0, attempt=1), pod(2, attempt=1, deleting=True)]).attempt(1)
    assert pod_ends.missing(current, 4) == [1, 3]
    assert pod_ends.missing(current, 2) == []


def test_pods_on_a_lost_node_are_force_deleted_once():
    pods = JobPods([pod(0, deleting=True, fault="DeletionByTaintManager"),
                    pod(1, deleting=True, fault="DeletionByTaintManager", grace=0), pod(2, deleting=True)])
    assert names(pod_ends.lost(pods)) == ["j-0-0"]


def test_each_doomed_set_is_one_selector():
    """A gang restart deletes an attempt's unfinished pods in one request (label and field selector), not one a pod."""
    policy = RunPolicy(backoffLimit=1)
    pods = JobPods([pod(0, attempt=0, phase="Failed"), pod(1, attempt=1, phase="Failed"), pod(0, attempt=1),
                    pod(2, attempt=1, phase="Pending"), pod(0, attempt=2)])
    sets = pod_ends.doomed_sets(pods, 2, policy, suspended=False, terminal=False)
    assert [(n, unfinished, names(of_set)) for n, unfinished, of_set in sets] == [
        (0, False, ["j-0-0"]), (1, True, ["j-0-1", "j-2-1"])]
    assert [(n, u) for n, u, _ in pod_ends.doomed_sets(pods, 2, RunPolicy(cleanPodPolicy="Running"), False, True)] \
        == [(None, True)]
