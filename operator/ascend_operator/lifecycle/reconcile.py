"""One lifecycle for every kind: wait for dependencies, create the objects, follow the pods, restart the gang
by policy, suspend and resume, finish and clean up, read progress, keep the result.

A kind is declared once as a ``JobKind``; ``register`` adds it to the kinds the operator follows. Jobs and pods
are followed by the operator's own informers (``job_informer``: one watch per kind, every object kept in
``object_cache`` so that a reconcile reads no job from the server; ``pod_informer``: one watch for every kind's
pods, which keeps the pod cache, ``pod_cache``), both cheaper per event than kopf's. Neither does the work
itself: both queue the job's key on a work queue (``workqueue``) that a shared pool of workers serves, one
reconcile per job at a time and one per burst of events, as controller-runtime does. A single sweep
(``sweeper``) queues live jobs every PROGRESS_INTERVAL for progress, deadlines, TTLs and dependencies, so no
per-object kopf timer and hence no finalizer is needed: deleting a job never waits for the operator.

Every decision comes from pure functions (``status.derive``, ``RunPolicy``, ``dependencies``); the handlers
only act on the difference between the old and the new status, under a per-job lock, so running them twice
(or after an operator restart) creates nothing twice.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

import kopf
from kubernetes.client.rest import ApiException
from pydantic import BaseModel, ValidationError

from . import attempts
from ..client import fan_out
from ..recovery import goodput
from ..progress import history
from ..faults import infra_fault
from .. import metrics
from ..api.group import LABEL_JOB_KIND, LABEL_JOB_NAME, POD_FINALIZER, TRAIN_JOB, Kind
from ..api.run_policy import RunPolicy, StallDetection
from ..cache.job_pods import JobPods, held, terminating
from ..client.kubeclient import STOPPING, ShuttingDown
from ..cache.object_cache import JOBS
from ..cache.pod_cache import JobKey, PodCache
from ..cache.informer import Informer
from ..cache.job_informer import JobInformer
from ..cache.pod_informer import PodInformer
from ..progress.scrape import scrape, scrape_events, scrape_series, scrape_tracking
from ..settings import PROGRESS_INTERVAL, RECONCILE_WORKERS
from .status import TERMINAL, condition, derive, is_true, now, set_condition, termination_result
from ..cache.workqueue import WorkQueue, Workers
from . import create_errors
from ..progress import engine_events
from ..kueue import integration as kueue
from ..recovery import stalls
from ..client.kubeclient import kube
from .spec import parse_spec
from .dependencies import cycle, readiness, refs, resolve

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobKind:
    kind: Kind
    spec_model: type[BaseModel]
    replicas: Callable[[Any], int]
    render: Callable[[str, str, Any], list[dict[str, Any]]]  # (name, namespace, spec) -> objects
    metrics_port: Callable[[Any], int | None]
    progress_fields: dict[str, str]  # metric field (ascend_engine.telemetry) -> status.progress field
    result_field: str  # where rank 0's final report goes: "progress" (merged) or "outputs"
    # (job object, resolved spec, status) -> (spec to render, status fields to add): e.g. host ports.
    prepare: Callable[[dict[str, Any], Any, dict[str, Any]], tuple[Any, dict[str, Any]]] = \
        lambda obj, spec, status: (spec, {})
    # The engine's final report -> status.progress fields once Succeeded (a short job may end between scrapes).
    final_progress: Callable[[dict[str, Any]], dict[str, Any]] = lambda result: {}
    # status.progress -> the same with its printer-column strings (TrainProgress.with_columns).
    progress_columns: Callable[[dict[str, Any]], dict[str, Any]] = lambda progress: progress
    # Indices of the pods whose metrics endpoint and final report make the progress (later ones win): rank 0 for
    # the engine; a Megatron-style trainer prints its iteration lines on the last rank.
    reporting_pods: Callable[[Any], list[int]] = lambda spec: [0]
    # (job object, spec before prepare, derived status, pods) -> (status, reason, message) to restart at another
    # size (reason ScaledIn / ScaledOut), (status, "", "") for a status-only change, or None: elastic jobs.
    resize: Callable[[dict[str, Any], Any, dict[str, Any], JobPods], tuple[dict[str, Any], str, str] | None] = \
        lambda obj, spec, status, pods: None
    # The spec's hang detection, or None where the kind has none (runPolicy.stallDetection, engine jobs only).
    stall_detection: Callable[[Any], StallDetection | None] = lambda spec: None


_LOCKS: defaultdict[tuple[str, str, str], threading.Lock] = defaultdict(threading.Lock)
_KNOWN: dict[tuple[str, str, str], tuple[JobKind, bool]] = {}  # key -> (kind, worth sweeping)
_KEPT: dict[tuple[str, str, str], int] = {}  # key -> the newest iteration its history ConfigMap holds
_KINDS: dict[str, JobKind] = {}
PODS = PodCache()  # every job's pods, fed by the pod handler
QUEUE = WorkQueue()  # job keys (kind, namespace, name) due for a reconcile
_workers: list[Workers] = []
_informers: list[Informer] = []  # the pods' first: the workers wait until it has listed
WATCHED_NAMESPACES: list[str] = []  # set by ``main`` from --namespace; empty: the whole cluster
_STOPPED: dict[JobKey, list[tuple[str, str]]] = {}  # (name, uid) of the pods the reconcile in flight deleted


def _reporters(job: JobKind, spec: Any, pods: JobPods, name: str, attempt: int) -> list[dict[str, Any]]:
    """The live pods of ``attempt`` whose metrics make the job's progress (rank 0; a trainer's first and last)."""
    found = (pods.get(attempts.pod_name(name, i, attempt)) for i in dict.fromkeys(job.reporting_pods(spec)))
    return [p for p in found if p is not None and not p["metadata"].get("deletionTimestamp")]


def _pods(job: JobKind, namespace: str, name: str) -> JobPods:
    return PODS.pods((job.kind.kind, namespace, name),
                     lambda: kube().list_pods(namespace, {LABEL_JOB_NAME: name, LABEL_JOB_KIND: job.kind.kind}))


def _live_progress(job: JobKind, spec: Any, reporters: list[dict[str, Any]],
                   kept: int) -> tuple[dict[str, Any] | None, list | None, list[dict]]:
    """The reporting pods' figures for status.progress (later pods win), the series of logged points for the
    history (from the first pod that serves one: rank 0 of an engine job; ``kept``: the newest iteration the
    history holds), and that pod's recent events."""
    port = job.metrics_port(spec)
    progress: dict[str, Any] = {}
    series = None
    events: list[dict] = []
    for pod in reporters:
        ip = pod.get("status", {}).get("podIP")
        if not port or not ip or pod["status"].get("phase") != "Running":
            continue
        figures = scrape(f"http://{ip}:{port}/metrics")
        if not figures:
            continue
        progress.update({job.progress_fields[k]: v for k, v in figures.items() if k in job.progress_fields})
        if series is None:
            series = scrape_series(f"http://{ip}:{port}", kept)
            events = scrape_events(f"http://{ip}:{port}")
    return ({**progress, "lastUpdateTime": now()}, series, events) if progress else (None, None, events)


def _tracking(job: JobKind, spec: Any, status: dict[str, Any], reporters: list[dict[str, Any]]) -> list[dict] | None:
    """status.tracking from rank 0 (``/tracking``) while the job names trackers that the status does not show yet
    (once there, a run's ids stay the same across restarts: no more reads)."""
    train = getattr(spec, "train", None)
    wanted = len(train.observability.trackers) if train else 0
    port = job.metrics_port(spec)
    if not wanted or len(status.get("tracking") or []) >= wanted or not port:
        return None
    for pod in reporters[:1]:
        ip = pod.get("status", {}).get("podIP")
        if ip and pod["status"].get("phase") == "Running":
            return scrape_tracking(f"http://{ip}:{port}") or None
    return None


def _policy(job: JobKind, obj: dict[str, Any]) -> RunPolicy:
    """The run policy even of a spec that failed validation elsewhere (TTL still applies to it)."""
    model = job.spec_model.model_fields["runPolicy"].annotation
    try:
        return model.model_validate((obj.get("spec") or {}).get("runPolicy") or {})
    except ValidationError:
        return model()


def _event(obj: dict[str, Any], reason: str, message: str, warning: bool = False) -> None:
    kube().post_event(obj, reason, message, warning)


def _delete_pods(key: JobKey, pods: list[dict[str, Any]], grace_seconds: int | None = None) -> int:
    """Delete the live ones among ``pods``, a few at a time (``fan_out``); the cache counts them as terminating."""
    doomed = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    at = now()
    stopped = _STOPPED.setdefault(key, [])  # their finalizers go once the status is written (``_release``)

    def delete(p: dict[str, Any]) -> None:
        name, uid = p["metadata"]["name"], p["metadata"]["uid"]
        if kube().delete_pod(key[1], name, uid, grace_seconds):
            PODS.deleting(key, name, uid, at)
            stopped.append((name, uid))
        else:
            PODS.gone(key, name, uid)

    errors = [r for r in fan_out.each(delete, doomed) if isinstance(r, Exception)]
    if errors:
        raise errors[0]
    return len(doomed)


def _release(key: JobKey, seen: JobPods | None) -> int:
    """Remove the operator's finalizer (``POD_FINALIZER``) from the pods whose end is now recorded: those this
    reconcile saw being deleted (``seen``: the pods it decided on, not the cache as it is now, which may hold a
    deletion that arrived during the reconcile and that no status has counted yet) and those it deleted itself.
    Called once the job's status is written, or when no status is left to write (the job is gone or being
    deleted). One patch a pod, a few at a time (``fan_out``); a pod without the finalizer costs
    nothing. How many were released."""
    todo = {name: uid for name, uid in _STOPPED.pop(key, [])}
    if seen is not None:
        todo = {name: uid for name, uid in todo.items() if (p := seen.get(name)) is None or held(p)}
        if seen.terminating:  # O(1) to ask; the walk below only when some pod is being deleted
            todo.update((p["metadata"]["name"], p["metadata"]["uid"]) for p in seen if terminating(p) and held(p))
    if not todo:
        return 0

    def release(item: tuple[str, str]) -> None:
        pod = kube().release_pod(key[1], *item)
        if pod is not None:
            PODS.released(pod)  # the next snapshot no longer asks for it; its DELETED event removes it

    errors = [r for r in fan_out.each(release, list(todo.items())) if isinstance(r, Exception)]
    if errors:
        raise errors[0]
    return len(todo)


def summarize(names: list[str], shown: int = 3) -> str:
    """'Kind/name' lists as counts and a few names: a 4096-pod list would not fit in a condition or an event."""
    by_kind: dict[str, list[str]] = {}
    for n in names:
        by_kind.setdefault(n.split("/", 1)[0], []).append(n)
    parts = []
    for kind, of_kind in by_kind.items():
        if len(of_kind) <= shown:
            parts.extend(of_kind)
        else:
            parts.append(f"{len(of_kind)} {kind}s ({', '.join(n.split('/', 1)[1] for n in of_kind[:2])}, ..., "
                         f"{of_kind[-1].split('/', 1)[1]})")
    return ", ".join(parts)


def _create(job: JobKind, obj: dict[str, Any], namespace: str, name: str, spec: Any,
            avoided: list[str], attempt: int) -> list[str]:
    """Create the objects that do not exist yet: the others first, then the pods of ``attempt`` a few at a time;
    the pods are kept off the ``avoided`` nodes."""
    objects = job.render(name, namespace, spec)
    attempts.stamp(objects, name, attempt)
    for o in objects:  # the pod stays, with its last status, until its end is recorded (``_release``)
        if o["kind"] == "Pod" and POD_FINALIZER not in (o["metadata"].get("finalizers") or []):
            o["metadata"]["finalizers"] = [*(o["metadata"].get("finalizers") or []), POD_FINALIZER]
    infra_fault.avoid_nodes(objects, avoided)
    kopf.adopt(objects, owner=obj)
    kueue.keep_off_children(objects)
    kueue.apply_admission(job.kind.kind, obj, objects)

    def create(o: dict[str, Any]) -> str | None:
        try:
            if o["kind"] == "ConfigMap":  # a restart or resume may load a different checkpoint
                kube().update_config_map(namespace, o)
                return None
            made = kube().create(namespace, o)
        except (ApiException, ValueError, TypeError) as e:  # the server's refusal, or the client's before sending
            raise create_errors.ChildCreateFailed(f"{o['kind']}/{o['metadata']['name']}", e) from None
        if made and o["kind"] == "Pod":
            PODS.wrote(made)
        return f"{o['kind']}/{o['metadata']['name']}" if made else None

    # The objects the pods use (Service, ConfigMap, PodGroup) first, side by side, then the pods.
    made: list[Any] = []
    for batch in ([o for o in objects if o["kind"] != "Pod"], [o for o in objects if o["kind"] == "Pod"]):
        results = fan_out.each(create, batch)
        failure = next((r for r in results if isinstance(r, Exception)), None)
        if failure is not None:
            raise failure
        made += results
    return [c for c in made if c]


def _wait_for_dependencies(job: JobKind, obj: dict[str, Any], spec: Any, status: dict[str, Any],
                           at: str) -> tuple[Any, dict[str, Any], bool]:
    """(spec with the dependencies' outputs, status, whether to go on creating and following pods)."""
    namespace = obj["metadata"]["namespace"]
    found = {ref: kube().get_custom(ref.kind.kind, namespace, ref.name) for ref in refs(spec)}
    if not found:
        return spec, status, True
    state, message = readiness(found)
    # A cycle is the cause whichever job on it is judged first: the others see it failed, and say the cycle too.
    if state in ("Waiting", "Failed") and (loop := cycle(job.kind, obj["metadata"]["name"], found,
                                                         lambda ref: kube().get_custom(ref.kind.kind, namespace,
                                                                                       ref.name))):
        state, message = "Cycle", loop
    conditions = status.get("conditions", [])
    if reason := {"Failed": "DependencyFailed", "Invalid": "DependencyInvalid", "Cycle": "DependencyCycle"}.get(state):
        conditions = set_condition(conditions, "Failed", "True", reason, message, at)
        return spec, {**status, "phase": "Failed", "conditions": conditions, "completionTime": at}, False
    if state == "Waiting":
        conditions = set_condition(conditions, "DependenciesReady", "False", "WaitingForDependencies", message, at)
        return spec, {**status, "phase": "Pending", "conditions": conditions}, False
    spec = resolve(spec, found, status)
    conditions = set_condition(conditions, "DependenciesReady", "True", "DependenciesSucceeded", message, at)
    return spec, {**status, "conditions": conditions}, True


def _release_lost(obj: dict[str, Any], key: JobKey, pods: JobPods) -> None:
    """Force-delete the pods evicted from a node that went NotReady or unreachable: no kubelet there will confirm
    their deletion, and the next attempt waits until the old gang is gone. (Their processes may still run on a node
    that is only cut off; a training job's new gang does not share state with them, and the old ranks' collectives
    fail.)"""
    for pod in pods:
        if pod["metadata"].get("deletionTimestamp") and infra_fault.node_fault(pod):
            if kube().delete_pod(key[1], pod["metadata"]["name"], pod["metadata"]["uid"], grace_seconds=0):
                _event(obj, "PodForceDeleted", f"pod {pod['metadata']['name']} force-deleted: its node "
                                               f"{infra_fault.node_name(pod) or '?'} cannot confirm the deletion")


def _announce_avoided(obj: dict[str, Any], before: dict[str, Any], after: dict[str, Any]) -> None:
    """One Warning event per node newly avoided, naming it (reason NodeFault or DeviceFault)."""
    known = {a["node"] for a in before.get("avoidedNodes") or []}
    for a in after.get("avoidedNodes") or []:
        if a["node"] not in known:
            _event(obj, a["reason"], f"node {a['node']}: {a['message']}; the job's new pods avoid it and the "
                                     "restart is not counted against runPolicy.backoffLimit", warning=True)


def _suspend(key: JobKey, pods: JobPods, status: dict[str, Any], at: str, why: str | None = None) -> dict[str, Any]:
    """Delete the current attempt's pods (resuming creates them again under the same names) and any still running
    of an older one; the older attempts' finished pods stay, with their logs. ``why``: the condition's message
    when Kueue suspended it."""
    attempt = attempts.current(status)
    deleted = _delete_pods(key, [p for p in pods.live() if attempts.of(p) == attempt] +
                           [p for p in attempts.stopping(pods.live()) if attempts.of(p) != attempt])
    if status.get("phase") == "Suspended":
        return status
    message = f"runPolicy.suspend is true: {deleted} pod(s) deleted; clearing it recreates them"
    if why:
        message = f"{why} ({deleted} pod(s) deleted)" if deleted else why
    conditions = set_condition(status.get("conditions", []), "Suspended", "True", "Suspended", message, at)
    conditions = set_condition(conditions, "Running", "False", "Suspended", message, at)
    conditions = set_condition(conditions, "Created", "False", "Suspended", "pods deleted while suspended", at)
    return {**status, "phase": "Suspended", "conditions": conditions}


def _read(key: JobKey) -> dict[str, Any] | None:
    """The job as last seen (``object_cache``), else as the server has it now."""
    obj = JOBS.get(key)
    if obj is None:
        obj = kube().get_custom(*key)
        if obj is not None:
            JOBS.observe(key, obj)
    return obj


def _write_status(key: JobKey, obj: dict[str, Any], status: dict[str, Any]) -> bool:
    """Patch the status decided on ``obj``, only if the job is still at ``obj``'s resourceVersion. False: it moved
    on (409: queued to be read and decided again) or is gone (404)."""
    try:
        JOBS.observe(key, kube().patch_status(*key, status, obj["metadata"].get("resourceVersion")))
        return True
    except ApiException as e:
        if e.status not in (404, 409):
            raise
        JOBS.forget(key)
        if e.status == 409:
            QUEUE.add(key)
        return False


def _said_by_created_event(previous: dict[str, Any], status: dict[str, Any]) -> bool:
    """A new job's first status, Pending because its objects were just created: the Created event this reconcile
    posted says so already, and a second event would cost a request a job for nothing."""
    created = condition(status, "Created") or {}
    return not previous.get("phase") and status["phase"] == "Pending" and created.get("status") == "True" \
        and created.get("message", "").startswith("created ")


def _reconcile(job: JobKind, namespace: str, name: str) -> None:
    key = (job.kind.kind, namespace, name)
    obj = _read(key)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        # Gone, or being deleted (foreground): its pods, deleted by the garbage collector, must not wait for a
        # status that will never be written. Their later events (the collector reaching them) queue the job again.
        _release(key, _pods(job, namespace, name))
        if obj is None:
            forget(job, namespace, name)
        return
    previous = obj.get("status") or {}
    at = now()
    if previous.get("phase") in TERMINAL:
        kueue.finished(job.kind.kind, obj, previous)
        policy = _policy(job, obj)
        # Pods a finished job still has (its status was written by someone else) go as its cleanPodPolicy says,
        # and the job is no longer swept unless its TTL is due.
        seen = _pods(job, namespace, name)
        _delete_pods(key, policy.pods_to_clean(seen.live()))
        _release(key, seen)
        _KNOWN[key] = (job, policy.ttlSecondsAfterFinished is not None)
        if policy.ttl_expired(previous.get("completionTime"), dt.datetime.now(dt.timezone.utc)):
            _event(obj, "Deleted", f"runPolicy.ttlSecondsAfterFinished ({policy.ttlSecondsAfterFinished}s) "
                                   "passed: deleting the job and what it created")
            kube().delete_custom(job.kind.kind, namespace, name)
            forget(job, namespace, name)
        return
    spec = parse_spec(job.spec_model, job.kind.kind, namespace, name, obj["spec"], obj)
    if spec is None:
        return
    pods = _pods(job, namespace, name)
    if kueue.gate(job.kind.kind, obj, spec.runPolicy.suspend, lambda: job.render(name, namespace, spec), pods):
        return
    policy: RunPolicy = spec.runPolicy
    status = dict(previous)
    if policy.suspend:
        status = _suspend((job.kind.kind, namespace, name), pods, status, at,
                          kueue.suspend_message(job.kind.kind, obj))
    else:
        if status.get("phase") == "Suspended":
            conditions = set_condition(status["conditions"], "Suspended", "False", "Resumed",
                                       "runPolicy.suspend cleared: recreating the pods", at)
            status = {**status, "phase": "Pending", "conditions": conditions}
        effective, status, go_on = _wait_for_dependencies(job, obj, spec, status, at)
        if go_on:
            status = _follow(job, obj, namespace, name, effective, policy, pods, status, at)
    status["observedGeneration"] = obj["metadata"].get("generation")
    status.setdefault("phase", "Pending")
    if status.get("progress"):
        status["progress"] = job.progress_columns(status["progress"])
    if status.get("progress") and status.get("progress") != previous.get("progress"):
        _KEPT[key] = history.record(kube(), obj, status["progress"], at)  # the dashboard's curves
    if status != previous:
        if not _write_status(key, obj, status):
            return  # not recorded: the pods keep their finalizer, the next reconcile decides on them again
        if status["phase"] != previous.get("phase") and not _said_by_created_event(previous, status):
            # The newest condition says why; of two set in the same second (Suspended=False Resumed and Failed
            # InvalidPodTemplate on a resume), the one named after the new phase.
            why = max(status.get("conditions") or [{}],
                      key=lambda c: (c.get("lastTransitionTime") or "", c.get("type") == status["phase"]))
            _event(obj, status["phase"], why.get("message", ""), warning=status["phase"] in ("Failed", "Restarting"))
        if status["phase"] in TERMINAL:
            kueue.finished(job.kind.kind, obj, status)
    _release(key, pods)  # what this status counted is written: the pods it saw ending may go
    metrics.job_phase(job.kind.kind, namespace, name, status["phase"])
    metrics.recoveries(job.kind.kind, namespace, name, previous, status)
    _KNOWN[(job.kind.kind, namespace, name)] = (job, status["phase"] not in TERMINAL or
                                                policy.ttlSecondsAfterFinished is not None)


def _follow(job: JobKind, obj: dict[str, Any], namespace: str, name: str, spec: Any, policy: RunPolicy,
            pods: JobPods, status: dict[str, Any], at: str) -> dict[str, Any]:
    """Create the objects when due (first time, after a gang restart, on resume), then derive the status."""
    desired = spec
    spec, extra = job.prepare(obj, spec, status)
    status = {**status, **extra}
    restarting = status.get("phase") == "Restarting"
    key = (job.kind.kind, namespace, name)
    attempt = attempts.current(status)
    if restarting and pods.terminating:
        _release_lost(obj, key, pods)
    # A new attempt starts once every pod of the previous one has stopped (``pods``: all attempts).
    if (not is_true(status, "Created") or (restarting and not pods.attempt(attempt).live_count)) \
            and not pods.terminating:
        if not create_errors.due(key):
            return status  # backing off after a refused create
        try:
            created = _create(job, obj, namespace, name, spec,
                              [a["node"] for a in status.get("avoidedNodes") or []], attempt)
        except create_errors.ChildCreateFailed as e:
            status, message, permanent = create_errors.failed(key, e.what, e.error, status, at)
            if permanent:  # the phase change posts the Warning event; a partial gang is of no use
                _delete_pods(key, _pods(job, namespace, name).attempt(attempt).live())
            else:
                _event(obj, "CreateFailed", message, warning=True)
            return status
        create_errors.reset(key)
        if restarting and tracks_goodput(job):
            status = goodput.old_pods_gone(status, time.time())
        if not is_true(status, "Created"):
            message = f"created {summarize(created)}" if created else "objects already exist"
            status["conditions"] = set_condition(status.get("conditions", []), "Created", "True", "Created",
                                                 message, at)
        if created:
            _event(obj, "Created", f"created {summarize(created)}")
        pods = _pods(job, namespace, name)
        _delete_pods(key, attempts.expired(pods.live(), attempt, policy.backoffLimit))
    current = pods.attempt(attempt)  # only the current attempt's pods decide; older ones are kept to read
    new = derive(current, job.replicas(spec), status, policy)
    if new.get("restarts", 0) > status.get("restarts", 0):
        _announce_avoided(obj, status, new)
        return _gang_restart(job, obj, key, pods, new, failed=current.in_phase("Failed"))
    if (change := job.resize(obj, desired, new, current)) is not None:
        new, reason, message = change
        if reason:  # a gang restart at the new size: the pods are created again once these are gone
            stopped = _delete_pods(key, attempts.stopping(pods.live()))
            metrics.RESIZES.labels(job.kind.kind, reason).inc()
            _event(obj, reason, f"{message}; stopped {stopped} pod(s) (recovery level Resize)",
                   warning=reason == "ScaledIn")
            return goodput.begin(new, "Resize", reason, message, time.time()) if tracks_goodput(job) else new
    reporters = _reporters(job, spec, current, name, attempt)
    progress, series, events = _live_progress(job, spec, reporters, _KEPT.get(key, 0))
    engine_events.post_new(key, obj, events)
    if progress and (tracking := _tracking(job, spec, status, reporters)):
        new["tracking"] = tracking
    if progress:
        new["progress"] = {**status.get("progress", {}), **progress}
        if tracks_goodput(job):
            new = goodput.fold(new, time.time())
        if series:
            # every point logged since the last scrape
            _KEPT[key] = history.record(kube(), obj, new["progress"], now(), series)
    new = stalls.check(key, obj, job.stall_detection(spec), policy, current, new, progress, at)
    if new.get("restarts", 0) > status.get("restarts", 0):
        return _gang_restart(job, obj, key, pods, new, stalls.STALLED_GRACE_SECONDS, current.in_phase("Failed"))
    if new["phase"] == "Succeeded":
        result = {k: v for pod in reporters for k, v in (termination_result(pod) or {}).items()} or None
        if result and job.result_field == "progress":
            evaluation = result.pop("evaluation", None)
            if tracking := result.pop("tracking", None):  # rank 0's trackers, also for a run shorter than a read
                new["tracking"] = tracking
            new["progress"] = {**new.get("progress", {}), **result, "lastUpdateTime": now()}
            if evaluation:
                new["evaluation"] = evaluation
        elif result:
            new[job.result_field] = result
        if final := job.final_progress(result or {}):
            new["progress"] = {**new.get("progress", {}), **final, "lastUpdateTime": now()}
        if result and new.get("progress"):
            _KEPT[key] = history.record(kube(), obj, new["progress"], now(), exact=True)
    if new["phase"] in TERMINAL:
        if tracks_goodput(job):  # the wall time ends at completionTime
            new = goodput.fold(new, time.time())
        cleaned = _delete_pods(key, policy.pods_to_clean(pods.live()))
        if cleaned:
            _event(obj, "PodsCleaned", f"runPolicy.cleanPodPolicy {policy.cleanPodPolicy}: deleted {cleaned} pod(s)")
    return new


def _gang_restart(job: JobKind, obj: dict[str, Any], key: JobKey, pods: JobPods, new: dict[str, Any],
                  grace_seconds: int | None = None, failed: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """Stop the gang: delete its pods that still run or wait; the finished ones (the failed pod that caused the
    restart) stay with their logs. ``_follow`` creates the next attempt's pods once these are gone. Counted by
    reason; a Replace recovery opens in status.recoveries (``failed``: the pods whose end it answers)."""
    restarting = condition(new, "Restarting")
    stopped = _delete_pods(key, attempts.stopping(pods.live()), grace_seconds)
    metrics.RESTARTS.labels(job.kind.kind, restarting["reason"]).inc()
    _event(obj, "GangRestart", f"{restarting['message']}; stopped {stopped} pod(s), the next attempt's pods are "
                               f"named {key[2]}-<index>-{attempts.current(new)} (recovery level Replace)", True)
    if tracks_goodput(job):
        new = goodput.begin(new, "Replace", restarting["reason"], restarting["message"], time.time(), failed)
    return new


def tracks_goodput(job: JobKind) -> bool:
    """Training jobs keep status.recoveries and status.goodput (the single-pod kinds have no training loop)."""
    return job.kind.kind == TRAIN_JOB.kind


def reconcile(job: JobKind, namespace: str, name: str) -> None:
    """Bring one job a step closer to what its spec and its pods say; serialized per job."""
    if STOPPING.is_set():  # shutting down: work queued before SIGTERM is dropped, not done against a gone server
        return
    key = (job.kind.kind, namespace, name)
    with _LOCKS[key], metrics.RECONCILE_SECONDS.labels(job.kind.kind).time():
        try:
            _reconcile(job, namespace, name)
        finally:
            _STOPPED.pop(key, None)  # a reconcile that ended early: its deleted pods are terminating in the cache,
            # and the next reconcile releases them with the others it sees so


def forget(job: JobKind, namespace: str, name: str) -> None:
    _KNOWN.pop((job.kind.kind, namespace, name), None)
    _KEPT.pop((job.kind.kind, namespace, name), None)
    try:
        kueue.release(job.kind.kind, namespace, name)
    except Exception as e:  # noqa: BLE001 - the Workload's own events bring the job's key back
        logger.warning("%s %s/%s is gone; its Workloads keep Kueue's finalizer for now: %s", job.kind.kind,
                       namespace, name, e)
    JOBS.forget((job.kind.kind, namespace, name))
    PODS.forget((job.kind.kind, namespace, name))
    create_errors.reset((job.kind.kind, namespace, name))  # a recreated job starts without backoff
    stalls.forget((job.kind.kind, namespace, name))
    engine_events.forget((job.kind.kind, namespace, name))
    metrics.job_phase(job.kind.kind, namespace, name, None)
    metrics.forget_job(namespace, name)


def _process(key: JobKey) -> None:
    kind, namespace, name = key
    if kind not in _KINDS:
        return
    if _informers and not _informers[0].synced.wait(60):
        logger.warning("pods not listed yet: reconciling %s %s/%s from a listing of its own", kind, namespace, name)
    try:
        reconcile(_KINDS[kind], namespace, name)
    except ShuttingDown:
        pass
    except Exception as e:  # noqa: BLE001 - backed off and reported; the sweep queues it again when due
        _reconcile_failed(_KINDS[kind], namespace, name, e)


def start_workers(count: int = RECONCILE_WORKERS) -> None:
    """The pod informer and the shared pool that serves QUEUE (started with the operator, in kopf's start-up
    handler; the workers wait until the informer has listed the pods)."""
    global QUEUE
    if not _workers:
        if not QUEUE.accepting:
            QUEUE = WorkQueue()
        _informers.append(PodInformer(kube(), PODS, lambda key: QUEUE.add(key), WATCHED_NAMESPACES).start())
        for job in _KINDS.values():
            _informers.append(JobInformer(kube(), job.kind, WATCHED_NAMESPACES,
                                          lambda type, obj, job=job: _job_seen(job, type, obj)).start())
        _informers.append(kueue.start(kube(), list(_KINDS), WATCHED_NAMESPACES, lambda key: QUEUE.add(key)))
        _workers.append(Workers(QUEUE, _process, count).start())


def stop_workers() -> None:
    while _informers:
        _informers.pop().stop()
    while _workers:
        _workers.pop().stop()


async def sweep_forever(stop: asyncio.Event) -> None:
    """Every PROGRESS_INTERVAL, queue each live job (and each finished one with a TTL) for a reconcile."""
    while not stop.is_set() and not STOPPING.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=PROGRESS_INTERVAL)
            return
        except asyncio.TimeoutError:
            pass
        for key, (_, worth) in list(_KNOWN.items()):
            if worth and create_errors.due(key):
                QUEUE.add(key)


def _reconcile_failed(job: JobKind, namespace: str, name: str, error: Exception) -> None:
    """A reconcile that raised (the API server refusing a status patch, a pod list timing out) is tried again by
    the sweep only after a capped exponential backoff, and says so in a Warning event instead of a log line every
    sweep."""
    failures, delay = create_errors.backoff((job.kind.kind, namespace, name))
    message = f"reconciling failed (attempt {failures}; next in {delay:.0f}s): {type(error).__name__}: {error}"
    logger.warning("%s %s/%s: %s", job.kind.kind, namespace, name, message)
    try:
        obj = kube().get_custom(job.kind.kind, namespace, name)
        if obj is not None:
            _event(obj, "ReconcileFailed", message, warning=True)
    except Exception as e:  # the API server itself may be what failed
        logger.warning("no event for %s %s/%s: %s", job.kind.kind, namespace, name, e)


def register(job: JobKind) -> None:
    """Follow ``job``'s kind: its informer starts with the workers (``start_workers``)."""
    _KINDS[job.kind.kind] = job


def _job_seen(job: JobKind, type: str | None, obj: dict[str, Any]) -> None:
    """New objects, spec changes and the listing (type None); our own status patches are only remembered."""
    namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    key = (job.kind.kind, namespace, name)
    if type == "DELETED":
        forget(job, namespace, name)
        if PODS.holds(key):  # pods still carrying the finalizer: the reconcile of the gone job releases them
            QUEUE.add(key)
        return
    JOBS.observe(key, obj)
    status = obj.get("status") or {}
    _KNOWN.setdefault(key, (job, True))
    if status.get("phase") in TERMINAL and type is not None:
        return
    if type in (None, "ADDED") or obj["metadata"].get("generation") != status.get("observedGeneration"):
        QUEUE.add(key)

