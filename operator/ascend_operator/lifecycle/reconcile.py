"""The reconcile: one level-triggered pass per job, the same in every phase, read top to bottom (``_reconcile``).

From the spec, the current attempt (``attempts``) and the elastic size, a pass computes the pods that should
exist, and makes it so, as Kubernetes' Job controller does:

1. a job gone or being deleted: its pods' finalizers go (their ends no longer count);
2. a finished job: its pods go as ``runPolicy.cleanPodPolicy`` says, every finalizer goes, its TTL is kept;
3. the spec is read as the engine will see it (a spec the operator refuses fails the job, the field named);
4. Kueue's gate: a queued job stays suspended until its Workload is admitted;
5. decide (``_decide``): suspension, dependencies, then the status the current attempt's pods say
   (``status.derive``: a failed pod, or a pod deleted after it ran, restarts the gang as a new attempt), and the
   current attempt's missing indices are created when nothing of another attempt may still run (a pod deleted
   before it ran is so replaced under its own name); once they are all bound, NODE_RANK's order by topology
   (``topology.placement``, spec.topology); an elastic resize, rank 0's progress and a stall follow;
6. record: the status is written, conditioned on the job's resourceVersion (a 409 decides again from a fresh
   read); nothing below happens unless it was written, so a count never depends on a write that was lost;
7. act (``_act``) on the written status: delete the pods that should not exist (older attempts' pods that still
   run, the current attempt's while suspended, at the end those the policy cleans), force-delete those a lost
   node cannot confirm, give the pods their NODE_RANK (annotations) once the order is written, and remove the
   finalizer from the pods whose end the status now counts.

Phases are derived for the user; no step branches on the phase to decide whether pods are created. Expectations
are the pod cache's write-through (``PODS.wrote``: a pass sees the pods it just created) and the pods'
deterministic names (a second create of the same pod is refused by the API server). Jobs and pods are followed
by the operator's own informers (``workers``), which only queue the job's key on the work queue.
"""
from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import defaultdict
from typing import Any

from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from .. import metrics
from ..api.group import LABEL_JOB_KIND, LABEL_JOB_NAME
from ..api.run_policy import RunPolicy
from ..cache.job_pods import JobPods, held
from ..cache.object_cache import JOBS
from ..cache.pod_cache import JobKey, PodCache
from ..cache.workqueue import WorkQueue
from ..settings import PROGRESS_INTERVAL
from ..client.kubeclient import STOPPING, kube
from ..kueue import integration as kueue
from ..progress import engine_events, history, live
from ..recovery import goodput, stalls
from ..topology import placement
from . import attempts, create_errors, kstatus, pod_calls, pod_ends
from .dependencies import cycle, readiness, refs, resolve
from .kinds import JobKind
from .spec import parse_spec
from .status import TERMINAL, condition, derive, is_true, now, set_condition

logger = logging.getLogger(__name__)

PODS = PodCache()  # every job's pods, fed by the pod informer and the reconcile's own writes
QUEUE = WorkQueue()  # job keys (kind, namespace, name) due for a reconcile
_LOCKS: defaultdict[JobKey, threading.Lock] = defaultdict(threading.Lock)
DUE: dict[JobKey, float] = {}  # key -> when (time.monotonic) a pass is due with no event to bring it (``_due``)
_KEPT: dict[JobKey, int] = {}  # key -> the newest iteration its history ConfigMap holds


def reconcile(job: JobKind, namespace: str, name: str) -> None:
    """Bring one job a step closer to what its spec and its pods say; serialized per job."""
    if STOPPING.is_set():  # shutting down: work queued before SIGTERM is dropped, not done against a gone server
        return
    with _LOCKS[(job.kind.kind, namespace, name)], metrics.RECONCILE_SECONDS.labels(job.kind.kind).time():
        _reconcile(job, namespace, name)


def _reconcile(job: JobKind, namespace: str, name: str) -> None:
    key = (job.kind.kind, namespace, name)
    obj = _read(key)
    pods = _pods(job, namespace, name)
    # 1. Gone, or being deleted (foreground): the garbage collector deletes the pods; none waits for a status.
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        pod_calls.release(PODS, key, [p for p in pods if held(p)] if pods.held_count else [])
        if obj is None:
            forget(job, namespace, name)
        return
    previous = obj.get("status") or {}
    # 2. Finished (by this operator or by someone's status write): it stays so.
    if previous.get("phase") in TERMINAL:
        _finished(job, obj, key, pods, previous)
        return
    # 3. The spec as the engine will see it; a refused one is marked Failed with the field named.
    spec = parse_spec(job.spec_model, job.kind.kind, namespace, name, obj["spec"], obj)
    if spec is None:
        return  # the Failed status brings the next pass, which cleans up as for any finished job
    # 4. Kueue's part: a change to the spec brings the next pass (this one would act on the old spec).
    if kueue.gate(job.kind.kind, obj, spec.runPolicy.suspend, lambda: job.render(name, namespace, spec), pods):
        return
    # 5. Decide, creating what is missing.
    status, pods = _decide(job, obj, key, spec, pods, previous)
    # 6. Record.
    if not _record(job, obj, key, previous, status):
        return  # not written: the next pass decides again from a fresh read
    # 7. Act on what was written.
    _act(job, obj, key, spec.runPolicy, status, pods)
    _schedule(key, _due(job, key, spec, status))


# -- 5. decide -------------------------------------------------------------------------------------------------

def _decide(job: JobKind, obj: dict[str, Any], key: JobKey, spec: Any, pods: JobPods,
            previous: dict[str, Any]) -> tuple[dict[str, Any], JobPods]:
    """The job's next status, and its pods after any creation."""
    at = now()
    policy = spec.runPolicy
    status = dict(previous)
    if policy.suspend:
        return _suspended(job, obj, key, spec, pods, status, at), pods
    if is_true(status, "Suspended"):  # resuming: the stopped gang must be gone before a new one starts
        attempt = attempts.current(status)
        if stopping := pod_ends.blocking(pods, attempt, resuming=True):
            message = f"runPolicy.suspend cleared: {stopping}, then the pods are created again"
            return {**status, "conditions": set_condition(status["conditions"], "Suspended", "True", "Resuming",
                                                          message, at)}, pods
        conditions = set_condition(status["conditions"], "Suspended", "False", "Resumed",
                                   "runPolicy.suspend cleared: recreating the pods", at)
        status = {**status, "phase": "Pending", "conditions": conditions}
    effective, status, ready = _wait_for_dependencies(job, obj, spec, status, at)
    if not ready:
        return status, pods
    effective, extra = job.prepare(obj, effective, status)
    status = {**status, **extra}
    attempt, expected = attempts.current(status), job.replicas(effective)
    blocked = pod_ends.blocking(pods, attempt, resuming=False)
    new = derive(pods.attempt(attempt), expected, status, policy, blocked=blocked)
    if _restarted(status, new):
        return _opened_replace(job, new, pods.attempt(attempt)), pods
    if new["phase"] in TERMINAL:
        return _ended(job, obj, key, effective, pods.attempt(attempt), attempt, new), pods
    if not blocked and (todo := pod_ends.missing(pods.attempt(attempt), expected)) and create_errors.due(key):
        try:
            created = pod_calls.create(PODS, job, obj, effective, attempt, todo,
                                       others=_first_creation(status), config=len(todo) == expected,
                                       avoided=[a["node"] for a in new.get("avoidedNodes") or []])
        except create_errors.ChildCreateFailed as e:
            return _create_failed(job, obj, key, e, new, at), _pods(job, *key[1:])
        create_errors.reset(key)
        pods = _pods(job, *key[1:])
        new = _created(job, obj, status, new, created, len(todo) == expected, at)
        new = derive(pods.attempt(attempt), expected, new, policy)
    current = pods.attempt(attempt)
    new = placement.decide(job.rank_order(effective), current, expected, attempt, new)  # NODE_RANK by topology
    if (change := job.resize(obj, spec, new, current)) is not None:
        new, reason, message = change
        if reason:  # a gang restart at the new size (a new attempt)
            metrics.RESIZES.labels(job.kind.kind, reason).inc()
            return (goodput.begin(new, "Resize", reason, message, time.time()) if job.trains else new), pods
    new, fresh = _progress(job, obj, key, effective, current, status, new)
    new = stalls.check(key, obj, job.stall_detection(effective), policy, current, new, fresh, at)
    if _restarted(status, new):
        return _opened_replace(job, new, current.in_phase("Failed")), pods
    return new, pods


def _restarted(before: dict[str, Any], after: dict[str, Any]) -> bool:
    return after.get("restarts", 0) > before.get("restarts", 0)


def _opened_replace(job: JobKind, status: dict[str, Any], current: JobPods | list[dict[str, Any]]) -> dict[str, Any]:
    """A gang restart decided: a Replace recovery opens in status.recoveries (``failed``: the pods whose end it
    answers, for its detection time)."""
    if not job.trains:
        return status
    failed = current.in_phase("Failed") + current.ending("Failed") if isinstance(current, JobPods) else current
    restarting = condition(status, "Restarting") or {}
    return goodput.begin(status, "Replace", restarting.get("reason", ""), restarting.get("message", ""), time.time(),
                         failed)


def _first_creation(status: dict[str, Any]) -> bool:
    """Whether the job's Service and PodGroup may not exist yet: no pods were ever created (or the first try
    failed). A later attempt reuses them (a create would be refused with 409)."""
    created = condition(status, "Created")
    return created is None or created.get("reason") == "CreateFailed"


def _created(job: JobKind, obj: dict[str, Any], before: dict[str, Any], status: dict[str, Any], created: list[str],
             whole_attempt: bool, at: str) -> dict[str, Any]:
    """The status after creating pods: Created, and the open recovery's stopping part once a new attempt starts."""
    if whole_attempt and is_true(before, "Restarting") and job.trains:
        status = goodput.old_pods_gone(status, time.time())
    if created:
        message = f"created {pod_calls.summarize(created)}"
        status = {**status, "conditions": set_condition(status.get("conditions", []), "Created", "True", "Created",
                                                        message, at)}
        _event(obj, "Created", message)
    return status


def _create_failed(job: JobKind, obj: dict[str, Any], key: JobKey, e: create_errors.ChildCreateFailed,
                   status: dict[str, Any], at: str) -> dict[str, Any]:
    status, message, permanent = create_errors.failed(key, e.what, e.error, status, at)
    if not permanent:  # a Failed phase posts its own Warning event (and its pods go as for any finished job)
        _event(obj, "CreateFailed", message, warning=True)
    return status


def _suspended(job: JobKind, obj: dict[str, Any], key: JobKey, spec: Any, pods: JobPods, status: dict[str, Any],
               at: str) -> dict[str, Any]:
    """Suspended: the current attempt's pods are deleted (``_act``) and created again on resume; what the stopped
    gang saved on SIGTERM is read from rank 0's final report, so the status says where it will resume from."""
    attempt = attempts.current(status)
    current = pods.attempt(attempt)
    saved = live.stopped_at_checkpoint(live.reporters(job, spec, current, key[2], attempt))
    progress = dict(status.get("progress") or {})
    if saved is not None and saved > (progress.get("lastCheckpointIteration") or 0):
        progress["lastCheckpointIteration"] = saved
        status = {**status, "progress": progress}
    why = kueue.suspend_message(job.kind.kind, obj)
    stopping = current.live_count
    message = why or "runPolicy.suspend is true: the pods are deleted; clearing it recreates them"
    if stopping and not is_true(status, "Suspended"):
        message += f" ({stopping} pod(s) deleted)"
    elif is_true(status, "Suspended"):
        message = (condition(status, "Suspended") or {}).get("message", message) if not why else message
    if checkpoint := progress.get("lastCheckpointIteration"):
        message = message.split("; resumes from")[0] + f"; resumes from the checkpoint of iteration {checkpoint}"
    conditions = set_condition(status.get("conditions", []), "Suspended", "True", "Suspended", message, at)
    if status.get("phase") != "Suspended":
        conditions = set_condition(conditions, "Running", "False", "Suspended", message, at)
        conditions = set_condition(conditions, "Created", "False", "Suspended", "pods deleted while suspended", at)
    return {**status, "phase": "Suspended", "conditions": conditions}


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


def _progress(job: JobKind, obj: dict[str, Any], key: JobKey, spec: Any, current: JobPods,
              before: dict[str, Any], new: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Rank 0's figures (and the history, its notices, the trackers) into the status, and what it said this time
    (None: it did not answer) for the stall check."""
    reporters = live.reporters(job, spec, current, key[2], attempts.current(new))
    progress, series, events = live.live_progress(job, spec, reporters, _KEPT.get(key, 0))
    engine_events.post_new(key, obj, events)
    if not progress:
        return new, None
    if tracking := live.tracking(job, spec, before, reporters):
        new["tracking"] = tracking
    new["progress"] = {**before.get("progress", {}), **progress}
    if job.trains:
        new = goodput.fold(new, time.time())
    if series:  # every point logged since the last scrape
        _KEPT[key] = history.record(kube(), obj, new["progress"], now(), series)
    return new, progress


def _ended(job: JobKind, obj: dict[str, Any], key: JobKey, spec: Any, current: JobPods, attempt: int,
           new: dict[str, Any]) -> dict[str, Any]:
    """A job that has just Succeeded or Failed: the reporting pods' final report into the status (and the history's
    last point)."""
    if new["phase"] == "Succeeded":
        result = live.final_report(live.reporters(job, spec, current, key[2], attempt))
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
    if job.trains:  # the wall time ends at completionTime
        new = goodput.fold(new, time.time())
    return new


# -- 6. record -------------------------------------------------------------------------------------------------

def _record(job: JobKind, obj: dict[str, Any], key: JobKey, previous: dict[str, Any], status: dict[str, Any]) -> bool:
    """Write the status decided on ``obj`` (only if the job is still at its resourceVersion), then say what
    changed: the phase, a gang restart, a resize, a node now avoided. False when it was not written."""
    status["observedGeneration"] = obj["metadata"].get("generation")
    status.setdefault("phase", "Pending")
    status["conditions"] = kstatus.conditions(status, now())["conditions"]  # Ready, Reconciling, Stalled (GitOps)
    if status.get("progress"):
        status["progress"] = job.progress_columns(status["progress"])
        if status["progress"] != previous.get("progress"):  # the dashboard's curves
            _KEPT[key] = history.record(kube(), obj, status["progress"], now())
    if status != previous:
        if not _write_status(key, obj, status):
            return False
        _announce(job, obj, key, previous, status)
        if status["phase"] in TERMINAL:
            kueue.finished(job.kind.kind, obj, status)
    metrics.job_phase(job.kind.kind, key[1], key[2], status["phase"])
    metrics.recoveries(job.kind.kind, key[1], key[2], previous, status)
    return True


def _announce(job: JobKind, obj: dict[str, Any], key: JobKey, before: dict[str, Any], after: dict[str, Any]) -> None:
    """The events of a written change."""
    if after["phase"] != before.get("phase") and not _said_by_created_event(before, after):
        # The newest condition says why; of two set in the same second (Suspended=False Resumed and Failed
        # InvalidPodTemplate on a resume), the one named after the new phase.
        why = max(after.get("conditions") or [{}],
                  key=lambda c: (c.get("lastTransitionTime") or "", c.get("type") == after["phase"]))
        _event(obj, after["phase"], why.get("message", ""), warning=after["phase"] in ("Failed", "Restarting"))
    known = {a["node"] for a in before.get("avoidedNodes") or []}
    for a in after.get("avoidedNodes") or []:
        if a["node"] not in known:
            _event(obj, a["reason"], f"node {a['node']}: {a['message']}; the job's new pods avoid it and the "
                                     "restart is not counted against runPolicy.backoffLimit", warning=True)
    if _restarted(before, after):
        restarting = condition(after, "Restarting") or {}
        metrics.RESTARTS.labels(job.kind.kind, restarting.get("reason", "")).inc()
        _event(obj, "GangRestart", f"{restarting.get('message', '')}; the running pods are stopped and the next "
                                   f"attempt's pods are named {key[2]}-<index>-{attempts.current(after)} (recovery "
                                   "level Replace)", True)
    if (after.get("placement") or {}).get("attempt") != (before.get("placement") or {}).get("attempt") and \
            after.get("placement"):
        _event(obj, "RanksOrdered", placement.summary(after["placement"]))
    resizes = lambda s: (s.get("elastic") or {}).get("resizes", 0)  # noqa: E731
    if resizes(after) > resizes(before):
        resized = condition(after, "Resized") or {}
        _event(obj, resized.get("reason", "Resized"), f"{resized.get('message', '')}; the running pods are stopped "
               "(recovery level Resize)", warning=resized.get("reason") == "ScaledIn")


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


# -- 7. act ----------------------------------------------------------------------------------------------------

def _act(job: JobKind, obj: dict[str, Any], key: JobKey, policy: RunPolicy, status: dict[str, Any],
         pods: JobPods) -> None:
    """Make the pods match the written status: delete, force-delete, release (``pod_ends`` says which)."""
    attempt, terminal = attempts.current(status), status.get("phase") in TERMINAL
    suspended = policy.suspend and not terminal
    restarting = condition(status, "Restarting") or {}
    # A stalled gang cannot finish its step, so SIGTERM's save-and-exit cannot happen: a short grace instead.
    grace = stalls.STALLED_GRACE_SECONDS if restarting.get("status") == "True" and \
        restarting.get("reason") == "Stalled" else None
    sets = pod_ends.doomed_sets(pods, attempt, policy, suspended, terminal)
    doomed = [p for _, _, of_set in sets for p in of_set]
    deleted = pod_calls.delete_sets(PODS, key, sets, grace)
    if terminal and deleted:
        _event(obj, "PodsCleaned", f"runPolicy.cleanPodPolicy {policy.cleanPodPolicy}: deleted {deleted} pod(s)")
    if lost := pod_ends.lost(pods):
        pod_calls.force_delete(PODS, obj, key, lost)
    for pod in pod_ends.replaced(pods, attempt, suspended or terminal):
        _event(obj, "PodReplaced", f"pod {pod['metadata']['name']} was deleted before it ran; a new pod of the same "
                                   f"name takes its place (the gang keeps attempt {attempt}, no restart counted)")
    if not (suspended or terminal):  # each pod's NODE_RANK, once status.placement holds the attempt's order
        pod_calls.annotate_ranks(PODS, key, placement.to_annotate(status, pods.attempt(attempt), attempt))
    suspended_gang = is_true(status, "Suspended")
    released = pod_ends.releasable(pods, attempt, terminal, suspended_gang)
    if deleted:  # a pod this pass deleted may go at once: its watch event brings no deletion the cache lacks, so
        # no later pass would come for it (only those: the status written counted no other deletion)
        ours, seen = {p["metadata"]["name"] for p in doomed}, {p["metadata"]["name"] for p in released}
        released += [p for p in pod_ends.releasable(_pods(job, *key[1:]), attempt, terminal, suspended_gang)
                     if p["metadata"]["name"] in ours and p["metadata"]["name"] not in seen]
    pod_calls.release(PODS, key, released)


def _finished(job: JobKind, obj: dict[str, Any], key: JobKey, pods: JobPods, status: dict[str, Any]) -> None:
    """A finished job: its Workload finished too, its pods cleaned and released, deleted once its TTL is due. A spec
    change that is allowed after the end (runPolicy: a TTL, say) is observed: the status takes the new generation,
    or kstatus (and Flux's or Argo CD's wait) would take the job for still reconciling."""
    if status.get("observedGeneration") != obj["metadata"].get("generation"):
        observed = {**status, "observedGeneration": obj["metadata"].get("generation")}
        observed["conditions"] = kstatus.conditions(observed, now())["conditions"]
        if not _write_status(key, obj, observed):
            return  # the job moved on: the next pass reads it again
        status = observed
    kueue.finished(job.kind.kind, obj, status)
    policy = _policy(job, obj)
    _act(job, obj, key, policy, status, pods)
    now_utc = dt.datetime.now(dt.timezone.utc)
    _schedule(key, policy.ttl_remaining(status.get("completionTime"), now_utc))
    if policy.ttl_expired(status.get("completionTime"), now_utc):
        _event(obj, "Deleted", f"runPolicy.ttlSecondsAfterFinished ({policy.ttlSecondsAfterFinished}s) "
                               "passed: deleting the job and what it created")
        kube().delete_custom(job.kind.kind, *key[1:])
        forget(job, *key[1:])


# -- when the next pass is due --------------------------------------------------------------------------------

def _due(job: JobKind, key: JobKey, spec: Any, status: dict[str, Any]) -> float | None:
    """Seconds until this job needs a pass that no event will bring, or None: as controller-runtime's
    RequeueAfter. Rank 0's figures (a running job's progress and stall clock, an elastic job's capacity) are read
    every PROGRESS_INTERVAL; dependencies are polled while waited for; a deadline, a create's backoff are timers.
    A pending or suspended job waits for its pods', its Workload's or its own events and costs nothing meanwhile."""
    policy = spec.runPolicy
    at = dt.datetime.now(dt.timezone.utc)
    if status.get("phase") in TERMINAL:
        return policy.ttl_remaining(status.get("completionTime"), at)
    due = [policy.deadline_remaining((condition(status, "Created") or {}).get("lastTransitionTime"), at),
           create_errors.remaining(key)]
    if status.get("phase") == "Running" or getattr(spec, "elastic", None) is not None or \
            (condition(status, "DependenciesReady") or {}).get("status") == "False":
        due.append(PROGRESS_INTERVAL)
    due = [d for d in due if d is not None]
    return min(due) if due else None


def _schedule(key: JobKey, seconds: float | None) -> None:
    if seconds is None:
        DUE.pop(key, None)
    else:
        DUE[key] = time.monotonic() + max(0.0, seconds)


# -- reading and forgetting ------------------------------------------------------------------------------------

def _read(key: JobKey) -> dict[str, Any] | None:
    """The job as last seen (``object_cache``), else as the server has it now."""
    obj = JOBS.get(key)
    if obj is None:
        obj = kube().get_custom(*key)
        if obj is not None:
            JOBS.observe(key, obj)
    return obj


def _pods(job: JobKind, namespace: str, name: str) -> JobPods:
    return PODS.pods((job.kind.kind, namespace, name),
                     lambda: kube().list_pods(namespace, {LABEL_JOB_NAME: name, LABEL_JOB_KIND: job.kind.kind}))


def _policy(job: JobKind, obj: dict[str, Any]) -> RunPolicy:
    """The run policy even of a spec that failed validation elsewhere (TTL still applies to it)."""
    model = job.spec_model.model_fields["runPolicy"].annotation
    try:
        return model.model_validate((obj.get("spec") or {}).get("runPolicy") or {})
    except ValidationError:
        return model()


def _event(obj: dict[str, Any], reason: str, message: str, warning: bool = False) -> None:
    kube().post_event(obj, reason, message, warning)


def forget(job: JobKind, namespace: str, name: str) -> None:
    """The job is gone: drop what the operator kept of it (its pods still held by the finalizer stay in the cache
    until released)."""
    key = (job.kind.kind, namespace, name)
    DUE.pop(key, None)
    _KEPT.pop(key, None)
    try:
        kueue.release(job.kind.kind, namespace, name)
    except Exception as e:  # noqa: BLE001 - the Workload's own events bring the job's key back
        logger.warning("%s %s/%s is gone; its Workloads keep Kueue's finalizer for now: %s", job.kind.kind,
                       namespace, name, e)
    JOBS.forget(key)
    PODS.forget(key)
    create_errors.reset(key)  # a recreated job starts without backoff
    stalls.forget(key)
    engine_events.forget(key)
    metrics.job_phase(job.kind.kind, namespace, name, None)
    metrics.forget_job(namespace, name)
