"""The operator as Kueue's controller for its own kinds (an "external framework" of Kueue).

Kueue builds a controller and a webhook only for the kinds it knows (batch Jobs, JobSets, Kubeflow jobs ...). For
a kind listed in its ``integrations.externalFrameworks`` it only records the kind (so that it recognises the
kind as the owner of Kueue-managed objects, and reads it when it walks an owner chain); the kind's own controller
does the rest, as Kueue's ``jobframework`` reconciler does for the built-in kinds. For a job labelled
``kueue.x-k8s.io/queue-name`` (a job without it is not Kueue's: ``manageJobsWithoutQueueName`` is Kueue's
default, false) that is, each reconcile (``gate``), in this order:

* **Suspended until admitted.** A queued job that runs without a Workload is suspended
  (``spec.runPolicy.suspend: true``, what Kueue's webhook does at creation for its own kinds): nothing is created
  before admission.
* **One Workload per job.** Once the job is suspended and has no pod left, the operator creates its Workload
  (``kueue.x-k8s.io/v1beta2``), named as Kueue names its own (``<kind>-<job>-<hash>``), controlled by the job
  (ownerReference), with Kueue's ``kueue.x-k8s.io/resource-in-use`` finalizer and ``kueue.x-k8s.io/job-uid``
  label; ``spec.queueName`` from the label; ``spec.podSets`` from the pods the job would create (identical pods
  form one pod set, ``main`` when there is one; each template holds what Kueue reads: the containers' resources,
  node selector, affinity, tolerations, priority class); the priority from the ``kueue.x-k8s.io/priority-class``
  label (a WorkloadPriorityClass), else the pods' PriorityClass, else the cluster's default class, else 0;
  ``maximumExecutionTimeSeconds`` from ``kueue.x-k8s.io/max-exec-time-seconds``. While the Workload has no quota
  reserved, a changed queue label or pod set updates it.
* **Admission.** When the Workload is ``Admitted`` the operator sets ``suspend: false`` (an event ``Started``); the
  pods it then creates carry the node labels and tolerations of the ResourceFlavors assigned to their pod set
  (``status.admission.podSetAssignments[].flavors``), the admission checks' pod set updates, and the
  ``kueue.x-k8s.io/podset`` label. A running job whose Workload is not admitted is suspended.
* **Eviction** (condition ``Evicted``: preempted, deactivated, its ClusterQueue stopped ...): the job is suspended
  (event ``Stopped``; the pods get SIGTERM, the engine saves a checkpoint of the step in flight); once none of its
  pods is left, the operator clears the Workload's quota reservation as Kueue's job controllers do (``admission``
  removed, ``QuotaReserved`` and ``Admitted`` false, ``Requeued`` true when preempted or after node failures), so
  the quota goes to the preemptor and the job waits in its queue again; readmission recreates the pods, which
  resume from the job's checkpoint.
* **Finished.** When the job has Succeeded or Failed, its Workload gets ``Finished`` (reason ``Succeeded`` or
  ``Failed``) and loses the finalizer, so Kueue releases its quota. A Workload being deleted stops the job (a new
  one is created); a deleted job's Workloads lose the finalizer so that garbage collection can remove them.

The operator follows Workloads with an informer of its own (``WorkloadInformer``): a change queues the owning job.
Without Kueue's API (not installed) a queued job stays suspended, with one Warning event. The queue label stays
off the pods (Kueue's pod integration would otherwise queue each pod on its own; kopf.adopt copies the job's
labels to its children, ``keep_off_children`` takes Kueue's off again).
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from kubernetes.client.rest import ApiException

from ..api.group import API_GROUP, API_VERSION
from ..cache.informer import Informer
from ..cache.job_pods import JobPods, phase, terminating
from ..client.kubeclient import KUEUE_API, KUEUE_GROUP, Kube
from ..cache.pod_cache import JobKey
from ..lifecycle.status import now, set_condition
from ..client.kubeclient import kube
from . import topology as tas

logger = logging.getLogger(__name__)

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
MAX_EXEC_TIME_LABEL = "kueue.x-k8s.io/max-exec-time-seconds"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
PODSET_LABEL = "kueue.x-k8s.io/podset"
FINALIZER = "kueue.x-k8s.io/resource-in-use"
POD_SETS_HASH = f"{API_GROUP}/pod-sets-hash"  # on the Workload: the pod sets it was made from,
JOB_GENERATION = f"{API_GROUP}/job-generation"  # and the job's generation they were rendered at
WORKLOAD_API_VERSION = f"{KUEUE_GROUP}/v1beta2"
MAX_POD_SETS = 8  # Kueue's limit
REQUEUED_REASONS = ("Preempted", "NodeFailures")  # evictions after which Kueue's job controllers requeue
# The pod spec fields Kueue reads from a pod set's template (quota, flavor fit, priority); the rest of a pod
# (commands, environment, volumes) is no business of the Workload's.
TEMPLATE_FIELDS = ("nodeSelector", "affinity", "tolerations", "priorityClassName", "runtimeClassName", "overhead",
                   "schedulerName", "resourceClaims")
CONTAINER_FIELDS = ("name", "image", "resources")

# Who the operator's kinds are (by kind name) and how to queue one of their jobs for a reconcile: set by
# lifecycle.workers.start.
_KINDS: set[str] = set()
_requeue: Callable[[JobKey], None] = lambda key: None
_WARNED: set[JobKey] = set()  # jobs told once that Kueue's API is not served


class ApiMissing(Exception):
    """Kueue's API is not served by this cluster."""


# -- the Workloads, as the informer last saw them ---------------------------------------------------

def _newer(candidate: dict[str, Any], held: dict[str, Any]) -> bool:
    try:
        return int(candidate["metadata"]["resourceVersion"]) >= int(held["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return True


def _owner(wl: dict[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the job of ours that controls this Workload, if one does."""
    for ref in wl["metadata"].get("ownerReferences") or []:
        if ref.get("controller") and ref.get("apiVersion") == f"{API_GROUP}/{API_VERSION}":
            return ref["kind"], ref["name"]
    return None


class WorkloadStore:
    """Every Workload of the operator's jobs by (namespace, name), and by owning job."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_name: dict[tuple[str, str], dict[str, Any]] = {}
        self._by_job: dict[JobKey, set[str]] = {}

    def observe(self, wl: dict[str, Any]) -> None:
        meta = wl["metadata"]
        owner = _owner(wl)
        if owner is None:
            return
        key = (meta["namespace"], meta["name"])
        with self._lock:
            held = self._by_name.get(key)
            if held is not None and held["metadata"].get("uid") == meta.get("uid") and not _newer(wl, held):
                return
            self._by_name[key] = wl
            self._by_job.setdefault((owner[0], meta["namespace"], owner[1]), set()).add(meta["name"])

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            wl = self._by_name.pop((namespace, name), None)
            owner = _owner(wl) if wl else None
            if owner is not None:
                names = self._by_job.get((owner[0], namespace, owner[1]), set())
                names.discard(name)
                if not names:
                    self._by_job.pop((owner[0], namespace, owner[1]), None)

    def of_job(self, key: JobKey, uid: str | None = None) -> list[dict[str, Any]]:
        """The Workloads the job ``key`` controls (``uid``: of that very job, not of an older one of its name)."""
        kind, namespace, _ = key
        with self._lock:
            found = [self._by_name[(namespace, n)] for n in sorted(self._by_job.get(key, ()))]
        return [w for w in found if uid is None or any(r.get("uid") == uid and r.get("kind") == kind
                                                       for r in w["metadata"].get("ownerReferences") or [])]

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._by_name.get((namespace, name))

    def names(self, namespace: str | None) -> set[tuple[str, str]]:
        with self._lock:
            return {k for k in self._by_name if namespace is None or k[0] == namespace}


WORKLOADS = WorkloadStore()


class WorkloadInformer(Informer):
    """Kueue's Workloads: those controlled by one of the operator's jobs are kept (``WORKLOADS``) and each change
    queues the job. Where Kueue's API is not served, it looks again every minute, quietly."""

    what = "workloads"
    ABSENT_RETRY_S = 60.0

    def __init__(self, kube_: Kube, namespaces: list[str]) -> None:
        super().__init__(kube_, namespaces)
        self._said_absent = False

    def path(self, namespace: str | None) -> str:
        return f"{KUEUE_API}/workloads" if namespace is None else f"{KUEUE_API}/namespaces/{quote(namespace)}/workloads"

    def _list(self, namespace: str | None) -> str:
        while True:
            try:
                return super()._list(namespace)
            except ApiException as e:
                if e.status != 404:
                    raise
                if not self._said_absent:
                    logger.info("Kueue's Workload API (%s) is not served: jobs labelled %s stay suspended until "
                                "Kueue is installed", WORKLOAD_API_VERSION, QUEUE_LABEL)
                    self._said_absent = True
                self.synced.set()  # an API not served has no objects: the (empty) cache is whole
                if self._stop.wait(self.ABSENT_RETRY_S):
                    return ""  # stopping: the watch that would follow does not start

    def listed(self, namespace: str | None, items: list[dict[str, Any]]) -> None:
        now_ = {(w["metadata"]["namespace"], w["metadata"]["name"]) for w in items}
        for ns, name in WORKLOADS.names(namespace) - now_:
            self.changed("DELETED", {"metadata": {"namespace": ns, "name": name}})
        for wl in items:
            self.changed("ADDED", wl)

    def changed(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        owner = _owner(obj)
        if kind == "DELETED":
            if owner is None:  # a listing's stand-in for one deleted unseen: the owner is in the held one
                held = WORKLOADS.get(meta["namespace"], meta["name"])
                owner = _owner(held) if held else None
            WORKLOADS.forget(meta["namespace"], meta["name"])
        else:
            WORKLOADS.observe(obj)
        if owner is not None and owner[0] in _KINDS:
            _requeue((owner[0], meta["namespace"], owner[1]))


def start(kube_: Kube, kinds: list[str], namespaces: list[str], requeue: Callable[[JobKey], None]) -> Informer:
    """Follow Workloads for ``kinds``' jobs; ``requeue`` queues a job for a reconcile."""
    global _requeue
    _KINDS.clear()
    _KINDS.update(kinds)
    _requeue = requeue
    return WorkloadInformer(kube_, namespaces).start()


# -- what a Workload says ----------------------------------------------------------------------------

def _condition(wl: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (wl.get("status") or {}).get("conditions") or [] if c.get("type") == type_), None)


def _true(wl: dict[str, Any], type_: str) -> bool:
    return (_condition(wl, type_) or {}).get("status") == "True"


def _set(conditions: list[dict[str, Any]], type_: str, status: str, reason: str, message: str, generation: int,
         at: str) -> list[dict[str, Any]]:
    """A Workload condition (metav1.Condition: a message of at most 32768 characters, observedGeneration)."""
    return set_condition(conditions, type_, status, reason, message[:32768], at, observedGeneration=generation)


def workload_name(kind: str, name: str, uid: str) -> str:
    """The name Kueue gives a job's Workload: ``<kind>-<name>`` (cut to fit) and 5 hex digits of a SHA-1 of the
    kind, group, name and uid, so a recreated job of the same name gets a Workload of its own."""
    digest = hashlib.sha1(f"{kind}\n{API_GROUP}\n{name}\n{uid}".encode()).hexdigest()[:5]
    return f"{f'{kind.lower()}-{name}'[:253 - 1 - 5]}-{digest}"


# -- pod sets and priority -------------------------------------------------------------------------

def _template(pod: dict[str, Any]) -> dict[str, Any]:
    spec = pod["spec"]
    out: dict[str, Any] = {"containers": [{k: c[k] for k in CONTAINER_FIELDS if c.get(k)} for c in spec["containers"]]}
    if spec.get("initContainers"):
        out["initContainers"] = [{k: c[k] for k in CONTAINER_FIELDS if c.get(k)} for c in spec["initContainers"]]
    out.update({k: spec[k] for k in TEMPLATE_FIELDS if spec.get(k)})
    held = pod["metadata"].get("annotations") or {}
    if topology := {k: held[k] for k in tas.ANNOTATIONS if k in held}:  # spec.topology (kueue/topology.py)
        return {"metadata": {"annotations": topology}, "spec": out}
    return {"spec": out}


def _pod_sets(objects: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The Workload's pod sets from the pods a job would create (identical templates form one set, in the order
    their first pod comes), and each pod's set by pod name."""
    groups: dict[str, dict[str, Any]] = {}
    of_pod: dict[str, str] = {}
    for pod in (o for o in objects if o["kind"] == "Pod"):
        template = _template(pod)
        signature = json.dumps(template, sort_keys=True)
        group = groups.setdefault(signature, {"template": template, "count": 0})
        group["count"] += 1
        of_pod[pod["metadata"]["name"]] = signature
    if len(groups) > MAX_POD_SETS:
        raise ValueError(f"the job's pods have {len(groups)} different shapes; Kueue takes at most {MAX_POD_SETS} "
                         "pod sets")
    names = {sig: "main" if len(groups) == 1 else f"set-{i}" for i, sig in enumerate(groups)}
    sets = [{"name": names[sig], "count": g["count"], "template": g["template"]} for sig, g in groups.items()]
    for pod_set in sets:
        if request := tas.topology_request((pod_set["template"].get("metadata") or {}).get("annotations") or {}):
            pod_set["topologyRequest"] = request
    return sets, {pod: names[sig] for pod, sig in of_pod.items()}


def _priority(obj: dict[str, Any], pod_sets: list[dict[str, Any]]) -> dict[str, Any]:
    """spec.priority and spec.priorityClassRef, as Kueue's jobframework picks them."""
    labels = obj["metadata"].get("labels") or {}
    if name := labels.get(PRIORITY_CLASS_LABEL):
        found = kube().get_workload_priority_class(name)
        if found is None:
            raise ValueError(f"WorkloadPriorityClass {name} (label {PRIORITY_CLASS_LABEL}) not found")
        return {"priority": found["value"],
                "priorityClassRef": {"group": KUEUE_GROUP, "kind": "WorkloadPriorityClass", "name": name}}
    name = next((s["template"]["spec"]["priorityClassName"] for s in pod_sets
                 if s["template"]["spec"].get("priorityClassName")), None)
    if name:
        found = kube().get_priority_class(name)
        if found is None:
            raise ValueError(f"PriorityClass {name} (priorityClassName) not found")
    else:
        defaults = [p for p in kube().list_priority_classes() if p.get("globalDefault")]
        found = min(defaults, key=lambda p: p["value"]) if defaults else None
    if found is None:
        return {"priority": 0}
    return {"priority": found["value"], "priorityClassRef": {"group": "scheduling.k8s.io", "kind": "PriorityClass",
                                                              "name": found["metadata"]["name"]}}


def _pod_sets_hash(pod_sets: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(pod_sets, sort_keys=True).encode()).hexdigest()[:16]


def _workload_body(kind: str, obj: dict[str, Any], pod_sets: list[dict[str, Any]]) -> dict[str, Any]:
    meta = obj["metadata"]
    labels = meta.get("labels") or {}
    spec: dict[str, Any] = {"queueName": labels[QUEUE_LABEL], "podSets": pod_sets, **_priority(obj, pod_sets)}
    if (seconds := labels.get(MAX_EXEC_TIME_LABEL, "")).isdigit() and int(seconds) > 0:
        spec["maximumExecutionTimeSeconds"] = int(seconds)
    return {
        "apiVersion": WORKLOAD_API_VERSION, "kind": "Workload",
        "metadata": {
            "name": workload_name(kind, meta["name"], meta["uid"]), "namespace": meta["namespace"],
            "labels": {JOB_UID_LABEL: meta["uid"]},
            "annotations": {POD_SETS_HASH: _pod_sets_hash(pod_sets), JOB_GENERATION: str(meta.get("generation"))},
            "finalizers": [FINALIZER],
            "ownerReferences": [{"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": kind, "name": meta["name"],
                                 "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": spec,
    }


# -- the reconcile's part --------------------------------------------------------------------------

def _find(kind: str, obj: dict[str, Any]) -> dict[str, Any] | None:
    """The job's Workload: from the informer's store, else (not seen yet) a GET of the name it would have."""
    meta = obj["metadata"]
    key = (kind, meta["namespace"], meta["name"])
    held = [w for w in WORKLOADS.of_job(key, meta["uid"]) if not _true(w, "Finished")] or \
        WORKLOADS.of_job(key, meta["uid"])
    if held:
        return held[0]
    found = kube().get_workload(meta["namespace"], workload_name(kind, meta["name"], meta["uid"]))
    if found is not None:
        WORKLOADS.observe(found)
    return found


def _active(pods: JobPods) -> int:
    """Pods that still hold their node's resources: not finished, or being deleted."""
    return sum(1 for p in pods if terminating(p) or phase(p) not in ("Succeeded", "Failed"))


def _set_suspend(kind: str, obj: dict[str, Any], value: bool, reason: str | None, message: str = "") -> None:
    """Set spec.runPolicy.suspend, with an event unless ``reason`` is None (the phase's own event says it)."""
    meta = obj["metadata"]
    kube().patch_custom(kind, meta["namespace"], meta["name"], {"spec": {"runPolicy": {"suspend": value}}})
    if reason:
        kube().post_event(obj, reason, message)


def _patch(wl: dict[str, Any], patch: dict[str, Any], status: bool = False) -> dict[str, Any]:
    """A merge patch of the Workload as it was read (409 when it moved on); the answer is kept."""
    meta = wl["metadata"]
    body = {**patch, "metadata": {**patch.get("metadata", {}), "resourceVersion": meta["resourceVersion"]}}
    answer = (kube().patch_workload_status if status else kube().patch_workload)(meta["namespace"], meta["name"], body)
    WORKLOADS.observe(answer)
    return answer


def _release(wl: dict[str, Any]) -> dict[str, Any]:
    """Drop Kueue's finalizer (the Workload can be deleted, its quota is released)."""
    finalizers = wl["metadata"].get("finalizers") or []
    if FINALIZER not in finalizers:
        return wl
    return _patch(wl, {"metadata": {"finalizers": [f for f in finalizers if f != FINALIZER]}})


def _clear_reservation(wl: dict[str, Any], evicted: dict[str, Any], at: str) -> None:
    """The job is stopped: give the quota back and wait in the queue again (what jobframework does after
    stopping an evicted job)."""
    generation = wl["metadata"].get("generation", 0)
    status = wl.get("status") or {}
    reason, message = evicted.get("reason") or "Evicted", evicted.get("message") or ""
    requeued = "True" if reason in REQUEUED_REASONS else "False"
    conditions = _set(status.get("conditions") or [], "Requeued", requeued, reason, message, generation, at)
    conditions = _set(conditions, "QuotaReserved", "False", "Pending", message, generation, at)
    change: dict[str, Any] = {"admission": None}
    admitted = _condition(wl, "Admitted")
    if admitted is not None and admitted.get("status") == "True":
        conditions = _set(conditions, "Admitted", "False", "NoReservation", "The workload has no reservation",
                          generation, at)
        try:  # the time it ran, as Kueue accumulates it
            since = dt.datetime.strptime(admitted["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ")
            ran = int((dt.datetime.strptime(at, "%Y-%m-%dT%H:%M:%SZ") - since).total_seconds())
            past = status.get("accumulatedPastExecutionTimeSeconds") or 0
            change["accumulatedPastExecutionTimeSeconds"] = past + ran
        except (KeyError, ValueError):
            pass
    _patch(wl, {"status": {**change, "conditions": conditions}}, status=True)


def _finish(wl: dict[str, Any], succeeded: bool, message: str, at: str) -> dict[str, Any]:
    conditions = _set((wl.get("status") or {}).get("conditions") or [], "Finished", "True",
                      "Succeeded" if succeeded else "Failed", message, wl["metadata"].get("generation", 0), at)
    return _patch(wl, {"status": {"conditions": conditions}}, status=True)


def _create(kind: str, obj: dict[str, Any], render: Callable[[], list[dict[str, Any]]]) -> dict[str, Any] | None:
    meta = obj["metadata"]
    pod_sets, _ = _pod_sets(render())
    body = _workload_body(kind, obj, pod_sets)
    try:
        made = kube().create_workload(meta["namespace"], body)
    except ApiException as e:
        if e.status == 404:  # no such resource type: Kueue is not installed
            raise ApiMissing() from None
        raise
    if made is None:  # made before (a reconcile that did not see it yet)
        made = kube().get_workload(meta["namespace"], body["metadata"]["name"])
    else:
        kube().post_event(obj, "CreatedWorkload", f"Created Workload: {meta['namespace']}/{body['metadata']['name']}")
    if made is not None:
        WORKLOADS.observe(made)
    return made


def _sync(kind: str, obj: dict[str, Any], wl: dict[str, Any], render: Callable[[], list[dict[str, Any]]]) -> None:
    """A suspended job's Workload without quota follows the job's queue label and pod sets."""
    if _true(wl, "QuotaReserved"):
        return
    queue = obj["metadata"]["labels"][QUEUE_LABEL]
    generation = str(obj["metadata"].get("generation"))
    annotations = wl["metadata"].get("annotations") or {}
    change: dict[str, Any] = {}
    if wl["spec"].get("queueName") != queue:
        change["spec"] = {"queueName": queue}
    if annotations.get(JOB_GENERATION) != generation:  # the spec changed: render its pods again (not every sweep)
        pod_sets, _ = _pod_sets(render())
        change["metadata"] = {"annotations": {JOB_GENERATION: generation}}
        if annotations.get(POD_SETS_HASH) != _pod_sets_hash(pod_sets):
            change.setdefault("spec", {})["podSets"] = pod_sets
            change["metadata"]["annotations"][POD_SETS_HASH] = _pod_sets_hash(pod_sets)
    if change:
        _patch(wl, change)
    if change.get("spec"):
        kube().post_event(obj, "UpdatedWorkload", f"Updated not matching Workload for suspended job: "
                                                  f"{wl['metadata']['namespace']}/{wl['metadata']['name']}")


def suspend_message(kind: str, obj: dict[str, Any]) -> str | None:
    """Why a queued job is suspended, for its Suspended condition (None: not Kueue's doing)."""
    labels = obj["metadata"].get("labels") or {}
    if QUEUE_LABEL not in labels:
        return None
    meta = obj["metadata"]
    held = WORKLOADS.of_job((kind, meta["namespace"], meta["name"]), meta.get("uid"))
    wl = held[0] if held else None
    if wl is not None and _true(wl, "Evicted"):
        evicted = _condition(wl, "Evicted") or {}
        return (f"evicted by Kueue ({evicted.get('reason')}: {evicted.get('message')}): pods deleted, the "
                f"checkpoint kept; resumes when Workload {meta['namespace']}/{wl['metadata']['name']} is admitted "
                "again")
    message = (f"queued in Kueue LocalQueue {labels[QUEUE_LABEL]}: suspended until Kueue admits its Workload "
               "(the operator then sets spec.runPolicy.suspend to false)")
    waiting = _condition(wl, "QuotaReserved") if wl is not None else None
    if waiting is not None and waiting.get("status") == "False" and waiting.get("message"):
        # what Kueue says it waits for: "LocalQueue lq doesn't exist", "couldn't assign flavors ...: insufficient quota"
        message += f"; Kueue: {waiting.get('reason')}: {waiting['message']}"
    return message


def gate(kind: str, obj: dict[str, Any], suspended: bool, render: Callable[[], list[dict[str, Any]]],
         pods: JobPods) -> bool:
    """Kueue's part of a reconcile of a live job; True when it changed the job's spec (the change brings the next
    reconcile, and the rest of this one would act on the old spec)."""
    meta = obj["metadata"]
    key = (kind, meta["namespace"], meta["name"])
    if QUEUE_LABEL not in (meta.get("labels") or {}):
        return False
    try:
        return _gate(kind, obj, key, suspended, render, pods)
    except ApiMissing:
        if not suspended:
            _set_suspend(kind, obj, True, None)
            return True
        if key not in _WARNED:
            _WARNED.add(key)
            kube().post_event(obj, "KueueNotInstalled", f"labelled {QUEUE_LABEL} but this cluster does not serve "
                                                        f"Kueue's {WORKLOAD_API_VERSION} Workloads: the job stays "
                                                        "suspended", warning=True)
        return False
    except ApiException as e:
        if e.status != 409:
            raise
        _requeue(key)  # a Workload that moved on since it was read: decide again on what it says now
        return True


def _gate(kind: str, obj: dict[str, Any], key: JobKey, suspended: bool, render: Callable[[], list[dict[str, Any]]],
          pods: JobPods) -> bool:
    at = now()
    wl = _find(kind, obj)
    if wl is not None and wl["metadata"].get("deletionTimestamp"):
        _release(wl)
        if not suspended:
            _set_suspend(kind, obj, True, "Stopped", "Workload is deleted")
            return True
        return False
    if wl is not None and _true(wl, "Finished"):  # Kueue declared it finished (it did not let it start)
        _release(wl)
        return False
    if wl is None:
        if not suspended:  # what Kueue's webhook does for its own kinds: the Suspended phase's event says it
            _set_suspend(kind, obj, True, None)
            return True
        if _active(pods):  # suspended a moment ago: its pods are being deleted
            return False
        _create(kind, obj, render)
        return False
    evicted = _condition(wl, "Evicted")
    if evicted is not None and evicted.get("status") == "True":
        if not suspended:
            _set_suspend(kind, obj, True, "Stopped", evicted.get("message") or "evicted by Kueue")
            return True
        if _true(wl, "QuotaReserved") and not _active(pods):
            _clear_reservation(wl, evicted, at)
        return False
    if suspended:
        if _true(wl, "Admitted"):
            cluster_queue = ((wl.get("status") or {}).get("admission") or {}).get("clusterQueue", "")
            _set_suspend(kind, obj, False, "Started", f"Admitted by clusterQueue {cluster_queue}")
            return True
        _sync(kind, obj, wl, render)
        return False
    if not _true(wl, "Admitted"):
        _set_suspend(kind, obj, True, "Stopped", "Not admitted by cluster queue")
        return True
    return False


def apply_admission(kind: str, obj: dict[str, Any], objects: list[dict[str, Any]]) -> None:
    """Give the pods about to be created what their pod set's admission says: the assigned flavors' node labels
    (as node selector) and tolerations, the admission checks' updates, the pod set label."""
    meta = obj["metadata"]
    if QUEUE_LABEL not in (meta.get("labels") or {}):
        return
    held = [w for w in WORKLOADS.of_job((kind, meta["namespace"], meta["name"]), meta["uid"]) if _true(w, "Admitted")]
    if not held:
        return
    wl = held[0]
    _, of_pod = _pod_sets(objects)
    status = wl.get("status") or {}
    infos: dict[str, dict[str, Any]] = {}
    flavors: dict[str, dict[str, Any] | None] = {}
    templates = {p["name"]: p.get("template") or {} for p in wl["spec"].get("podSets") or []}
    for assignment in (status.get("admission") or {}).get("podSetAssignments") or []:
        info: dict[str, Any] = {"nodeSelector": {}, "tolerations": [], "labels": {PODSET_LABEL: assignment["name"]},
                                "annotations": {}, "topology": None}
        if assignment.get("topologyAssignment") or assignment.get("delayedTopologyRequest"):  # admitted by TAS
            info["topology"] = ((templates.get(assignment["name"]) or {}).get("metadata") or {}).get("annotations") \
                or {}
        for flavor in dict.fromkeys((assignment.get("flavors") or {}).values()):
            if flavor not in flavors:
                flavors[flavor] = kube().get_resource_flavor(flavor)
            spec = (flavors[flavor] or {}).get("spec") or {}
            info["nodeSelector"].update(spec.get("nodeLabels") or {})
            info["tolerations"] += spec.get("tolerations") or []
        for check in status.get("admissionChecks") or []:
            for update in check.get("podSetUpdates") or []:
                if update.get("name") == assignment["name"]:
                    for field in ("nodeSelector", "labels", "annotations"):
                        info[field].update(update.get(field) or {})
                    info["tolerations"] += update.get("tolerations") or []
        infos[assignment["name"]] = info
    for pod in (o for o in objects if o["kind"] == "Pod"):
        info = infos.get(of_pod.get(pod["metadata"]["name"], ""))
        if info is None:
            continue
        spec = pod["spec"]
        if info["nodeSelector"]:
            spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **info["nodeSelector"]}
        if info["tolerations"]:
            spec["tolerations"] = list(spec.get("tolerations") or []) + info["tolerations"]
        pod["metadata"]["labels"] = {**(pod["metadata"].get("labels") or {}), **info["labels"]}
        if info["annotations"]:
            pod["metadata"]["annotations"] = {**(pod["metadata"].get("annotations") or {}), **info["annotations"]}
        if info["topology"] is not None:
            tas.gate(pod, wl["metadata"]["name"], info["topology"])


def finished(kind: str, obj: dict[str, Any], status: dict[str, Any]) -> None:
    """A job that Succeeded or Failed: its Workloads are Finished and lose the finalizer (Kueue releases the
    quota)."""
    meta = obj["metadata"]
    key = (kind, meta["namespace"], meta["name"])
    held = WORKLOADS.of_job(key, meta.get("uid"))
    if not held and QUEUE_LABEL in (meta.get("labels") or {}):
        held = [w for w in [_find(kind, obj)] if w is not None]
    at = now()
    succeeded = status.get("phase") == "Succeeded"
    reason = next((c for c in status.get("conditions") or [] if c.get("type") == status.get("phase")), {})
    message = reason.get("message") or f"the job {status.get('phase', '').lower()}"
    for wl in held:
        try:
            if not _true(wl, "Finished"):
                wl = _finish(wl, succeeded, message, at)
                kube().post_event(obj, "FinishedWorkload", f"Workload '{meta['namespace']}/{wl['metadata']['name']}' "
                                                           "is declared finished")
            _release(wl)
        except ApiException as e:
            if e.status not in (404, 409):
                raise
            _requeue(key)


def release(kind: str, namespace: str, name: str) -> None:
    """The job is gone: its Workloads lose the finalizer, so that garbage collection can delete them."""
    _WARNED.discard((kind, namespace, name))
    for wl in WORKLOADS.of_job((kind, namespace, name)):
        try:
            _release(wl)
        except ApiException as e:
            if e.status == 409:
                fresh = kube().get_workload(namespace, wl["metadata"]["name"])
                if fresh is not None:
                    _release(fresh)
            elif e.status != 404:
                raise


def keep_off_children(objects: list[dict[str, Any]]) -> None:
    """Drop Kueue's labels from the objects a job creates: only the job itself is a Kueue workload. Pods lose
    Kueue's topology annotations too, which ``apply_admission`` gives back to a pod set that Kueue admitted by
    topology (``kueue/topology.py``)."""
    for obj in objects:
        labels = obj["metadata"].get("labels") or {}
        for key in [k for k in labels if k.startswith("kueue.x-k8s.io/")]:
            del labels[key]
        if obj["kind"] == "Pod":
            tas.strip(obj)
