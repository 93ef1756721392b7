"""The pods of every job as the watch last reported them (an informer's store), so a reconcile reads memory, not
the API: listing a 4096-node job's pods per event was 13 MB and a second of CPU each time.

Fed four ways, all under one lock:

- ``replace``: the informer's listing (``pod_informer``), at start-up and whenever its watch expired;
- ``apply``: the informer's watch events (ADDED / MODIFIED / DELETED);
- ``wrote`` / ``deleting`` / ``gone``: what the operator's own create and delete calls returned (write-through),
  so the reconcile right after creating a gang sees it before the watch delivers it: without this, a reconcile
  between the creates and their ADDED events would read a missing pod as a deleted one;
- ``seed``: one paginated list of a job's pods if it is read before the informer's listing covered its
  namespace. Events that raced the list win when they are newer (by resourceVersion, a number on etcd).

A DELETED event removes a pod only if the uid matches, so a late event of a deleted pod never removes the
recreated pod of the same name.

A pod's end is never missed: every pod the operator creates carries its finalizer (``POD_FINALIZER``), so a pod
deleted while the operator was not watching (stopped during a failover, or busy reconciling the job) stays in the
API, with a deletionTimestamp and its last status (Failed, ``DisruptionTarget: DeletionByPodGC``), and so here:
the watch or the listing shows it, and ``status.derive`` reads why it ended, not a pod gone without a word. The
operator removes the finalizer (``lifecycle.reconcile._release``) once the reconcile that saw the pod terminating
has written the job's status; its DELETED event then removes it here. ``forget`` keeps such pods of a job that is
gone, so their finalizers are removed too.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..api.group import LABEL_JOB_KIND, LABEL_JOB_NAME
from .job_pods import JobPods, held, slim

JobKey = tuple[str, str, str]  # (kind, namespace, job name)


def _rv(pod: dict[str, Any]) -> int:
    rv = pod["metadata"].get("resourceVersion") or ""
    return int(rv) if rv.isdigit() else 0


def job_key(pod: dict[str, Any]) -> JobKey | None:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if LABEL_JOB_KIND not in labels or LABEL_JOB_NAME not in labels:
        return None
    return labels[LABEL_JOB_KIND], meta.get("namespace") or "", labels[LABEL_JOB_NAME]


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two slim pods say the same, resourceVersion aside (a no-op update needs no reconcile)."""
    return a["status"] == b["status"] and a["metadata"].get("deletionTimestamp") == \
        b["metadata"].get("deletionTimestamp") and a["metadata"]["uid"] == b["metadata"]["uid"]


class PodCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[JobKey, JobPods] = {}
        self._seeded: set[JobKey] = set()
        self._deleted_uids: dict[JobKey, set[str]] = {}  # seen DELETED while the job's seed list was in flight
        self._listed: set[str | None] = set()  # namespaces the informer listed (None: all of them)

    # -- from the watch ------------------------------------------------------------------------

    def apply(self, event_type: str | None, pod: dict[str, Any]) -> bool:
        """One watch event (``None``: kopf's listing). Whether the job's pods changed in a way that matters."""
        key = job_key(pod)
        if key is None:
            return False
        new = slim(pod)
        name, uid = new["metadata"]["name"], new["metadata"]["uid"]
        with self._lock:
            pods = self._jobs.get(key)
            old = pods.get(name) if pods is not None else None
            if event_type == "DELETED":
                if key in self._deleted_uids:
                    self._deleted_uids[key].add(uid)
                if old is None or old["metadata"]["uid"] != uid:
                    return False
                pods.remove(name)
                if not len(pods):
                    self._jobs.pop(key, None)  # read again as empty: nothing to keep for a job without pods
                return True
            if old is not None and old["metadata"]["uid"] == uid and _rv(old) > _rv(new):
                return False  # older than what a write-through or the seed already put there
            if old is not None and _same(old, new):
                pods.put(new)  # keep the newest resourceVersion
                return False
            self._jobs.setdefault(key, JobPods()).put(new)
            return True

    def _is_seeded(self, key: JobKey) -> bool:
        return key in self._seeded or None in self._listed or key[1] in self._listed

    def replace(self, namespace: str | None, listed: list[dict[str, Any]]) -> set[JobKey]:
        """Every pod of ``namespace`` (None: all) as one list says; the jobs whose pods changed."""
        fresh: dict[JobKey, JobPods] = {}
        for pod in listed:
            key = job_key(pod)
            if key is not None:
                fresh.setdefault(key, JobPods()).put(slim(pod))
        with self._lock:
            changed = set()
            for key in [k for k in self._jobs if namespace is None or k[1] == namespace] + list(fresh):
                old, new = self._jobs.get(key), fresh.get(key, JobPods())
                if old is None or len(old) != len(new) or any(
                        (o := old.get(p["metadata"]["name"])) is None or not _same(o, p) for p in new):
                    changed.add(key)
                if len(new):
                    self._jobs[key] = new
                else:
                    self._jobs.pop(key, None)
            self._listed.add(namespace)
            return changed

    # -- from the operator's own writes --------------------------------------------------------

    def wrote(self, pod: dict[str, Any]) -> None:
        """A pod the operator just created (the API's answer)."""
        key = job_key(pod)
        if key is None:
            return
        new = slim(pod)
        with self._lock:
            pods = self._jobs.setdefault(key, JobPods())
            old = pods.get(new["metadata"]["name"])
            if old is None or old["metadata"]["uid"] != new["metadata"]["uid"] or _rv(old) < _rv(new):
                pods.put(new)

    def released(self, pod: dict[str, Any]) -> None:
        """A pod the operator just removed its finalizer from (the API's answer): updates the pod held, never adds
        it back: a pod with no finalizer left and a deletionTimestamp is gone at once, and its DELETED event may
        have come first."""
        key = job_key(pod)
        if key is None:
            return
        new = slim(pod)
        with self._lock:
            pods = self._jobs.get(key)
            old = pods.get(new["metadata"]["name"]) if pods is not None else None
            if old is not None and old["metadata"]["uid"] == new["metadata"]["uid"] and _rv(old) < _rv(new):
                pods.put(new)

    def deleting(self, key: JobKey, name: str, uid: str, at: str) -> None:
        """The operator asked to delete this pod: it counts as terminating until its DELETED event."""
        with self._lock:
            pods = self._jobs.get(key)
            old = pods.get(name) if pods is not None else None
            if old is not None and old["metadata"]["uid"] == uid and not old["metadata"].get("deletionTimestamp"):
                pods.put({**old, "metadata": {**old["metadata"], "deletionTimestamp": at}})

    def gone(self, key: JobKey, name: str, uid: str) -> None:
        """The API said the pod no longer exists (404 on delete)."""
        with self._lock:
            pods = self._jobs.get(key)
            old = pods.get(name) if pods is not None else None
            if old is not None and old["metadata"]["uid"] == uid:
                pods.remove(name)

    # -- reads ---------------------------------------------------------------------------------

    def pods(self, key: JobKey, list_pods: Callable[[], list[dict[str, Any]]]) -> JobPods:
        """A snapshot of the job's pods (O(N) references copied, no pod copied); ``list_pods`` (the API) is called
        once per job, the first time it is asked for."""
        with self._lock:
            if self._is_seeded(key):
                return self._jobs.setdefault(key, JobPods()).copy()
            self._deleted_uids.setdefault(key, set())
        try:
            listed = list_pods()  # outside the lock: the watch keeps flowing meanwhile
        except BaseException:
            with self._lock:
                self._deleted_uids.pop(key, None)
            raise
        with self._lock:
            if not self._is_seeded(key):
                self._seed(key, listed)
            return self._jobs.setdefault(key, JobPods()).copy()

    def _seed(self, key: JobKey, listed: list[dict[str, Any]]) -> None:
        pods = self._jobs.setdefault(key, JobPods())
        deleted = self._deleted_uids.pop(key, None) or set()
        for pod in map(slim, listed):
            old = pods.get(pod["metadata"]["name"])
            if pod["metadata"]["uid"] in deleted or (old is not None and _rv(old) >= _rv(pod)):
                continue
            pods.put(pod)
        self._seeded.add(key)

    def forget(self, key: JobKey) -> None:
        """The job is gone: its pods go with it (their DELETED events then find nothing), except those that still
        carry the operator's finalizer: they exist until it is removed, and the reconcile of the gone job removes
        it from those being deleted (the garbage collector deletes the others, and their events queue the job)."""
        with self._lock:
            pods = self._jobs.pop(key, None)
            kept = [p for p in pods if held(p)] if pods is not None else []
            if kept:
                self._jobs[key] = JobPods(kept)
            self._seeded.discard(key)
            self._deleted_uids.pop(key, None)

    def holds(self, key: JobKey) -> bool:
        """Whether the cache still has pods of this job (after ``forget``: pods with the operator's finalizer)."""
        with self._lock:
            return bool(self._jobs.get(key))

    def size(self) -> int:
        with self._lock:
            return sum(len(p) for p in self._jobs.values())
