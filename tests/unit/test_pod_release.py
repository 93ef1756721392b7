"""Which pods the operator releases (removes its finalizer from) at the end of a reconcile: those whose end the
status it wrote counted (seen being deleted in the reconcile's snapshot) and those it deleted itself; never a pod
whose deletion arrived during the reconcile, after its snapshot (that one waits for the next reconcile, which
counts it)."""
from ascend_operator.api.group import POD_FINALIZER
from ascend_operator.lifecycle import reconcile as lifecycle
from ascend_operator.cache.job_pods import JobPods

KEY = ("AscendTrainJob", "default", "j")


def pod(i, deleting=False, finalizers=(POD_FINALIZER,)):
    meta = {"name": f"j-{i}-0", "uid": f"uid-{i}", "resourceVersion": "1",
            "labels": {"ascendtrain.dev/job-name": "j", "ascendtrain.dev/job-kind": "AscendTrainJob",
                       "ascendtrain.dev/replica-index": str(i), "ascendtrain.dev/attempt": "0"}}
    if finalizers:
        meta["finalizers"] = list(finalizers)
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": "Running"}}


class FakeKube:
    def __init__(self):
        self.released = []

    def release_pod(self, namespace, name, uid):
        self.released.append((namespace, name, uid))
        return None  # as if already gone: the cache is left to the DELETED event


def test_release_takes_what_the_snapshot_saw_ending_and_what_the_reconcile_deleted(monkeypatch):
    fake = FakeKube()
    monkeypatch.setattr(lifecycle, "kube", lambda: fake)
    # 0: deleted before the reconcile (PodGC); 1: live when the snapshot was taken (its deletion, if any, came
    # later); 2: deleted by this reconcile; 3: being deleted but already released; 4: deleted, no finalizer.
    seen = JobPods([pod(0, deleting=True), pod(1), pod(2), pod(3, deleting=True, finalizers=()),
                    pod(4, deleting=True, finalizers=("other.io/keep",))])
    lifecycle._STOPPED[KEY] = [("j-2-0", "uid-2"), ("j-5-0", "uid-5")]  # 5: created and deleted in the reconcile
    assert lifecycle._release(KEY, seen) == 3
    assert sorted(fake.released) == [("default", "j-0-0", "uid-0"), ("default", "j-2-0", "uid-2"),
                                     ("default", "j-5-0", "uid-5")]
    assert KEY not in lifecycle._STOPPED
    fake.released.clear()
    assert lifecycle._release(KEY, JobPods([pod(1)])) == 0 and fake.released == []  # nothing ending: no call
