"""The operator's pod cache: what it holds after watch events, its own writes and the first listing, and the
per-job counts it keeps, which must equal a recount of the pods (the status is derived from them)."""
import random

from ascend_operator.cache.job_pods import JobPods, index, phase, ready
from ascend_operator.cache.pod_cache import PodCache
from ascend_operator.lifecycle.status import derive

KEY = ("AscendTrainJob", "default", "big")


def pod(i, uid=None, rv=1, phase_="Pending", is_ready=False, deleting=False, job="big", attempt=None):
    meta = {"name": f"{job}-{i}" if attempt is None else f"{job}-{i}-{attempt}", "namespace": "default",
            "uid": uid or f"uid-{i}", "resourceVersion": str(rv),
            "labels": {"ascendtrain.dev/job-name": job, "ascendtrain.dev/job-kind": "AscendTrainJob",
                       "ascendtrain.dev/replica-index": str(i), "other": "dropped"},
            "annotations": {"big": "x" * 1000}}
    if attempt is not None:
        meta["labels"]["ascendtrain.dev/attempt"] = str(attempt)
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status = {"phase": phase_, "conditions": [{"type": "Ready", "status": "True" if is_ready else "False"},
                                              {"type": "Initialized", "status": "True"}]}
    return {"metadata": meta, "spec": {"containers": [{"name": "engine", "image": "x" * 500}]}, "status": status}


def never_listed():
    raise AssertionError("the cache listed pods again")


def seeded(cache, listed=()):
    return cache.pods(KEY, lambda: list(listed))


def counts(live, every=None):
    """Pending/running and ready among the live pods; succeeded and failed among all (a pod deleted after it
    finished still finished)."""
    every = live if every is None else every
    return {"active": sum(phase(p) in ("Pending", "Running") for p in live), "ready": sum(ready(p) for p in live),
            "succeeded": sum(phase(p) == "Succeeded" for p in every),
            "failed": sum(phase(p) == "Failed" for p in every)}


def test_events_keep_the_counts_a_recount_would_give_for_the_job_and_each_attempt():
    cache, rng = PodCache(), random.Random(7)
    seeded(cache)
    truth = {}
    for step in range(1, 3001):
        i, a = rng.randrange(20), rng.randrange(3)
        if rng.random() < 0.2:
            if (i, a) in truth:
                cache.apply("DELETED", truth.pop((i, a)))
            continue
        uid = truth[i, a]["metadata"]["uid"] if (i, a) in truth else f"uid-{i}-{a}-{rng.random()}"
        p = pod(i, uid, step, rng.choice(["Pending", "Running", "Succeeded", "Failed"]),
                rng.random() < 0.5, rng.random() < 0.1, attempt=a)
        cache.apply("MODIFIED" if (i, a) in truth else "ADDED", p)
        truth[i, a] = p
    pods = cache.pods(KEY, never_listed)
    live = [p for p in truth.values() if not p["metadata"].get("deletionTimestamp")]
    assert len(pods) == len(truth) and pods.live_count == len(live)
    assert pods.replica_counts() == counts(live, list(truth.values()))
    assert pods.attempt_numbers() == [0, 1, 2]
    for a in range(3):
        view, of_a = pods.attempt(a), [p for (_, pa), p in truth.items() if pa == a]
        live_a = [p for p in of_a if not p["metadata"].get("deletionTimestamp")]
        assert len(view) == len(of_a) and view.live_count == len(live_a) and view.replica_counts() == counts(live_a, of_a)
        assert [index(p) for p in view.in_phase("Running")] == sorted(index(p) for p in live_a
                                                                      if phase(p) == "Running")
    assert len(pods.attempt(3)) == 0


def test_pods_are_kept_slim():
    cache = PodCache()
    cache.apply("ADDED", pod(0))
    kept = seeded(cache).get("big-0")
    assert "spec" not in kept and "annotations" not in kept["metadata"]
    assert set(kept["metadata"]["labels"]) == {"ascendtrain.dev/job-name", "ascendtrain.dev/job-kind",
                                               "ascendtrain.dev/replica-index"}
    cache.apply("ADDED", pod(1, attempt=2))
    assert seeded(cache).get("big-1-2")["metadata"]["labels"]["ascendtrain.dev/attempt"] == "2"
    assert [c["type"] for c in kept["status"]["conditions"]] == ["Ready"]


def test_a_late_deleted_event_of_the_old_pod_leaves_the_recreated_one():
    cache = PodCache()
    seeded(cache)
    cache.wrote(pod(0, uid="new", rv=10))
    assert not cache.apply("DELETED", pod(0, uid="old", rv=9))
    assert seeded(cache).get("big-0")["metadata"]["uid"] == "new"


def test_own_writes_show_before_the_watch_and_the_echo_queues_nothing():
    cache = PodCache()
    seeded(cache)
    cache.wrote(pod(0, rv=5))
    assert seeded(cache).live_count == 1
    assert not cache.apply("ADDED", pod(0, rv=5))  # the watch's echo of our create
    cache.deleting(KEY, "big-0", "uid-0", "2026-01-01T00:00:00Z")
    pods = seeded(cache)
    assert pods.live_count == 0 and pods.terminating == 1  # no new gang is created over terminating pods
    assert cache.apply("DELETED", pod(0, rv=6))
    assert len(seeded(cache)) == 0


def test_an_update_that_changes_nothing_the_operator_reads_queues_nothing():
    cache = PodCache()
    cache.apply("ADDED", pod(0, rv=1))
    assert not cache.apply("MODIFIED", pod(0, rv=2))
    assert cache.apply("MODIFIED", pod(0, rv=3, phase_="Running"))
    assert not cache.apply("MODIFIED", pod(0, rv=2, phase_="Pending"))  # older than what is held


def test_the_first_listing_does_not_undo_newer_events():
    cache = PodCache()
    listed = [pod(0, rv=5), pod(1, rv=5), pod(2, rv=5)]

    def list_pods():  # the watch delivers while the list is in flight
        cache.apply("MODIFIED", pod(0, rv=7, phase_="Failed"))
        cache.apply("DELETED", pod(1, rv=8))
        return listed

    pods = cache.pods(KEY, list_pods)
    assert phase(pods.get("big-0")) == "Failed" and pods.get("big-1") is None and pods.get("big-2")
    assert cache.pods(KEY, never_listed).live_count == 2


def test_a_snapshot_does_not_move_under_a_reconcile():
    cache = PodCache()
    snapshot = seeded(cache, [pod(0)])
    cache.apply("MODIFIED", pod(0, rv=2, phase_="Failed"))
    assert snapshot.count("Pending") == 1 and snapshot.count("Failed") == 0


def test_derive_reads_the_same_from_the_cache_as_from_a_list():
    pods = [pod(i, phase_="Running", is_ready=i % 2 == 0) for i in range(8)] + [pod(8, deleting=True)]
    previous = {"phase": "Pending", "conditions": [{"type": "Created", "status": "True", "reason": "Created",
                                                    "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    assert derive(JobPods(pods), 8, previous) == derive(pods, 8, previous)


def test_a_new_listing_replaces_the_namespace_and_names_the_jobs_that_changed():
    cache = PodCache()
    cache.replace("default", [pod(0), pod(1), pod(0, job="other")])
    assert cache.pods(KEY, never_listed).live_count == 2  # listed: no listing of its own
    # The watch expired; meanwhile big-1 went away and big-0 started running; "other" is unchanged.
    changed = cache.replace("default", [pod(0, rv=3, phase_="Running"), pod(0, job="other")])
    assert changed == {KEY}
    pods = cache.pods(KEY, never_listed)
    assert pods.live_count == 1 and pods.count("Running") == 1
    assert cache.replace("default", []) == {KEY, ("AscendTrainJob", "default", "other")}
    assert cache.size() == 0


FINALIZER = "ascendtrain.dev/pod-tracking"
NODE_GONE = {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC",
             "message": "PodGC: node no longer exists", "lastTransitionTime": "2026-01-01T00:00:00Z"}
RUNNING_JOB = {"phase": "Running", "conditions": [{"type": "Created", "status": "True", "reason": "Created",
                                                   "message": "created", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}


def gc_pod(i, rv, deleting=True, finalizers=(FINALIZER,)):
    """What PodGC leaves of a pod whose node was deleted: Failed, DisruptionTarget, being deleted; the finalizer
    keeps it in the API."""
    p = pod(i, rv=rv, phase_="Failed", deleting=deleting, job="big", attempt=0)
    p["status"]["conditions"].append(NODE_GONE)
    p["status"]["containerStatuses"] = [{"name": "engine", "state": {"running": {}}}]  # as its kubelet last said
    p["metadata"]["finalizers"] = list(finalizers)
    p["spec"]["nodeName"] = "node-2"
    return p


def test_a_pod_held_by_the_finalizer_keeps_its_last_status_and_derive_reads_a_node_fault():
    from ascend_operator.api.run_policy import RunPolicy
    cache = PodCache()
    # The operator was stopped while PodGC failed and deleted pod 1: its listing at start-up shows it held.
    cache.replace("default", [pod(0, rv=1, phase_="Running", is_ready=True, attempt=0), gc_pod(1, rv=2)])
    pods = cache.pods(KEY, never_listed)
    held_pod = pods.get("big-1-0")
    assert held_pod["metadata"]["finalizers"] == [FINALIZER] and held_pod["metadata"]["deletionTimestamp"]
    assert held_pod["status"]["phase"] == "Failed" and held_pod["spec"] == {"nodeName": "node-2"}
    assert pods.terminating == 1 and pods.live_count == 1
    status = derive(pods.attempt(0), 2, RUNNING_JOB, RunPolicy(backoffLimit=0))
    assert status["phase"] == "Restarting" and status["disruptions"] == 1, status
    assert [(a["node"], a["reason"]) for a in status["avoidedNodes"]] == [("node-2", "NodeFault")]
    assert "DeletionByPodGC" in status["avoidedNodes"][0]["message"]
    # Without the finalizer the same pod is simply gone by then, with no word of why: its index is missing, and the
    # reconcile creates it again (a pod of a gang that had run meets its peers' failed collectives, which say so).
    cache.replace("default", [pod(0, rv=1, phase_="Running", is_ready=True, attempt=0)])
    waiting = derive(cache.pods(KEY, never_listed).attempt(0), 2, RUNNING_JOB, RunPolicy(backoffLimit=0))
    assert waiting["phase"] == "Pending" and waiting.get("restarts", 0) == 0
    assert "1 of 2 pods not created yet" in next(c for c in waiting["conditions"] if c["type"] == "Running")["message"]


def test_the_watch_keeps_a_held_pod_until_its_deleted_event_and_the_release_queues_nothing():
    cache = PodCache()
    seeded(cache)
    assert cache.apply("ADDED", gc_pod(1, rv=1, deleting=False, finalizers=(FINALIZER,))) is True
    assert cache.apply("MODIFIED", gc_pod(1, rv=2)) is True  # PodGC's delete: the finalizer holds it
    assert cache.pods(KEY, never_listed).terminating == 1
    # The operator's release (the finalizer gone) changes nothing a status reads: no reconcile, the cache moves on.
    assert cache.apply("MODIFIED", gc_pod(1, rv=3, finalizers=())) is False
    assert "finalizers" not in cache.pods(KEY, never_listed).get("big-1-0")["metadata"]
    assert cache.apply("DELETED", gc_pod(1, rv=4, finalizers=())) is True
    assert len(cache.pods(KEY, never_listed)) == 0


def test_forgetting_a_gone_job_keeps_the_pods_that_still_carry_the_finalizer():
    cache = PodCache()
    cache.replace("default", [])  # the informer listed the namespace: the job is not listed again once forgotten
    cache.apply("ADDED", gc_pod(0, rv=1))
    cache.apply("ADDED", gc_pod(1, rv=2, finalizers=()))
    cache.apply("ADDED", gc_pod(2, rv=3, deleting=False, finalizers=("other.io/keep", FINALIZER)))
    cache.forget(KEY)
    assert cache.holds(KEY)
    assert sorted(p["metadata"]["name"] for p in cache.pods(KEY, never_listed)) == ["big-0-0", "big-2-0"]
    cache.apply("MODIFIED", gc_pod(0, rv=4, finalizers=()))  # released
    cache.apply("MODIFIED", gc_pod(2, rv=5, finalizers=("other.io/keep",)))
    cache.forget(KEY)
    assert not cache.holds(KEY)


def test_a_release_answered_after_the_deleted_event_does_not_bring_the_pod_back():
    cache = PodCache()
    seeded(cache)
    cache.apply("ADDED", gc_pod(1, rv=2))
    cache.released(gc_pod(1, rv=3, finalizers=()))  # answered first: the cache moves on
    assert "finalizers" not in cache.pods(KEY, never_listed).get("big-1-0")["metadata"]
    cache.apply("DELETED", gc_pod(1, rv=4, finalizers=()))
    cache.released(gc_pod(1, rv=3, finalizers=()))  # or answered after the pod is gone: no ghost
    assert len(cache.pods(KEY, never_listed)) == 0
