"""The conditions GitOps tools read (ascend_operator.lifecycle.kstatus): Ready, Reconciling and Stalled from the
phase, with the finishing condition's reason and words, and no write when nothing changed. kstatus itself reads
them on real objects in tests/e2e/test_gitops.py."""
from ascend_operator.lifecycle import kstatus
from ascend_operator.lifecycle.status import condition, set_condition

T0, T1, T2 = "2026-11-28T10:00:00Z", "2026-11-28T10:01:00Z", "2026-11-28T10:02:00Z"


def _kinds(status):
    return {t: (c["status"], c["reason"], c["message"]) for t in ("Ready", "Reconciling", "Stalled")
            if (c := condition(status, t))}


def test_running_is_reconciling_with_the_running_conditions_words():
    status = {"phase": "Running", "conditions": set_condition([], "Running", "True", "PodsRunning",
                                                              "2/2 pods ready", T0)}
    got = kstatus.conditions(status, T1)
    assert _kinds(got) == {"Ready": ("False", "Running", "2/2 pods ready"),
                           "Reconciling": ("True", "Running", "2/2 pods ready"),
                           "Stalled": ("False", "Running", "2/2 pods ready")}
    assert got["conditions"][0] == status["conditions"][0]  # the others untouched, first in the list


def test_pending_without_conditions_says_it_waits():
    got = kstatus.conditions({}, T0)
    assert _kinds(got)["Reconciling"] == ("True", "Pending", "Pending: waiting for the operator")


def test_suspended_is_in_progress_not_failed():
    status = {"phase": "Suspended", "conditions": set_condition([], "Suspended", "True", "QueueMissing",
                                                                "LocalQueue team-a doesn't exist", T0)}
    kinds = _kinds(kstatus.conditions(status, T1))
    assert kinds["Reconciling"] == ("True", "Suspended", "LocalQueue team-a doesn't exist")
    assert kinds["Stalled"][0] == "False"


def test_succeeded_is_ready_and_failed_is_stalled_with_the_cause():
    running = kstatus.conditions({"phase": "Running", "conditions": []}, T0)
    done = {**running, "phase": "Succeeded",
            "conditions": set_condition(running["conditions"], "Succeeded", "True", "JobSucceeded",
                                        "all 2 pods completed", T1)}
    kinds = _kinds(kstatus.conditions(done, T1))
    assert kinds == {"Ready": ("True", "JobSucceeded", "all 2 pods completed"),
                     "Reconciling": ("False", "JobSucceeded", "all 2 pods completed"),
                     "Stalled": ("False", "JobSucceeded", "all 2 pods completed")}
    failed = {**running, "phase": "Failed",
              "conditions": set_condition(running["conditions"], "Failed", "True", "PodFailed",
                                          "pod a-0-0 exited 1: ValueError: bad", T2)}
    got = kstatus.conditions(failed, T2)
    assert _kinds(got)["Stalled"] == ("True", "PodFailed", "pod a-0-0 exited 1: ValueError: bad")
    assert _kinds(got)["Ready"][0] == "False" and _kinds(got)["Reconciling"][0] == "False"
    # lastTransitionTime moves only on a flip: Ready stayed False since T0, Stalled became True at T2.
    assert condition(got, "Ready")["lastTransitionTime"] == T0
    assert condition(got, "Stalled")["lastTransitionTime"] == T2


def test_the_newest_condition_reads_the_same_words_as_the_failure():
    """The SDK, the CLI and the dashboard show the newest condition's message: a tie between Failed and Stalled
    (set in the same second) gives the same words either way."""
    status = {"phase": "Failed", "conditions": set_condition([], "Failed", "True", "BackoffLimitExceeded",
                                                             "restarts used", T1)}
    got = kstatus.conditions(status, T1)
    newest = max(got["conditions"], key=lambda c: c["lastTransitionTime"])
    assert newest["message"] == "restarts used"


def test_nothing_changes_when_nothing_changed():
    status = kstatus.conditions({"phase": "Running", "conditions": []}, T0)
    assert kstatus.conditions(status, T1) == status
