"""Status from what the pods say: a pure function of the pods and the previous status (unit-tested)."""
from __future__ import annotations

import datetime as dt
import json
from typing import Any

from ascend_engine.inplace import EXHAUSTED_REASON as IN_PLACE_EXHAUSTED
from ascend_engine.inplace import REPEATED_REASON as IN_PLACE_REPEATED

from ..api.run_policy import MASTER_UNREACHABLE_EXIT, RunPolicy
from ..faults.disruption import disruption
from ..faults.failure_cause import RERUN_REQUESTED, failure_cause, numeric_failure
from ..faults.infra_fault import fault, node_name
from ..cache.job_pods import JobPods, finished_before_deletion, has_run, held

TERMINAL = ("Succeeded", "Failed")


def now(at: dt.datetime | None = None) -> str:
    return (at or dt.datetime.now(dt.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), None)


def is_true(status: dict[str, Any], type_: str) -> bool:
    return (condition(status, type_) or {}).get("status") == "True"


def set_condition(conditions: list[dict[str, Any]], type_: str, status: str, reason: str, message: str,
                  at: str, **extra: Any) -> list[dict[str, Any]]:
    """Upsert one condition; lastTransitionTime moves only when its status flips (Kubernetes convention).
    ``extra``: more fields to set on it (metav1.Condition's observedGeneration, for Kueue's Workloads)."""
    out = [dict(c) for c in conditions]
    for c in out:
        if c["type"] == type_:
            if c["status"] != status:
                c["lastTransitionTime"] = at
            c.update(status=status, reason=reason, message=message, **extra)
            return out
    out.append({"type": type_, "status": status, "reason": reason, "message": message, **extra,
                "lastTransitionTime": at})
    return out


def _terminated(pod: dict[str, Any]) -> dict[str, Any]:
    for cs in pod.get("status", {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            return term
    return {}


def _waiting_reason(pod: dict[str, Any]) -> str:
    """Why a pod is not running yet, in the scheduler's or kubelet's own words."""
    st = pod.get("status", {})
    for c in st.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return f"{c.get('reason', 'Unschedulable')}: {c.get('message', '')}".strip()
    for cs in st.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting:
            return f"{waiting.get('reason', 'Waiting')}: {waiting.get('message', '')}".strip(": ")
    return "Pending"


def termination_result(pod: dict[str, Any] | None) -> dict[str, Any] | None:
    """The engine's final JSON report from a finished container's termination message."""
    message = _terminated(pod or {}).get("message")
    try:
        result = json.loads(message) if message else None
    except ValueError:
        return None  # FallbackToLogsOnError put log lines there: the engine died before reporting
    return result if isinstance(result, dict) else None


def _failure(pod: dict[str, Any], policy: RunPolicy) -> tuple[bool, str, str]:
    """(retryable, reason, message) for one failed pod, from its exit code and the engine's report."""
    term = _terminated(pod)
    code = term.get("exitCode")
    name = pod["metadata"]["name"]
    if code is None:  # evicted, node lost: the kubelet never saw the container end
        why = pod.get("status", {}).get("reason") or "Unknown"
        return True, "PodFailed", f"pod {name} failed without an exit code ({why})"
    message = f"pod {name} failed: exit code {code} ({term.get('reason', 'Error')})"
    report = termination_result(pod) or {}
    if code == MASTER_UNREACHABLE_EXIT and report.get("reason") == "MasterUnreachable":
        return policy.is_retryable(code), "MasterUnreachable", f"{message}: {report.get('message', '')}"
    if report.get("reason") == "Preempted":  # SIGTERM: the engine saved its step; torchrun exits 1 all the same
        return True, "Preempted", (f"{message}: preempted after iteration {report.get('iteration')}, checkpoint "
                                   f"{report.get('checkpoint') or 'not saved'}")
    if report.get("reason") == IN_PLACE_REPEATED or report.get("permanent") is True:
        # the same error again before a step was trained: no restart, in place or not, can fix it
        return False, report.get("reason") or IN_PLACE_REPEATED, f"{message}: {report.get('message', '')}; permanent"
    if report.get("reason") == IN_PLACE_EXHAUSTED:  # the next rung of the ladder: replace the gang
        return True, IN_PLACE_EXHAUSTED, f"{message}: {report.get('message', '')}"
    if numeric := numeric_failure(code, report, term.get("message")):  # train.numerics, Megatron's codes 16 / 17
        retryable, reason, why = numeric
        return retryable, reason, f"{message}: {why}"
    if report.get("reason") == "EvaluationFailed":  # training went through; retrying would not fix the data
        return False, "EvaluationFailed", f"{message}: evaluation failed: {report.get('message', '')}"
    retryable = policy.is_retryable(code)
    if cause := failure_cause(term.get("message")):
        message += f": {cause}"
    if not retryable:
        message += "; permanent (codes 1-127 fail at once unless listed in runPolicy.retryableExitCodes)"
    return retryable, "PodFailed", message


def _finish(status: dict[str, Any], phase: str, reason: str, message: str, at: str) -> dict[str, Any]:
    conditions = set_condition(status.get("conditions", []), "Running", "False", reason, message, at)
    conditions = set_condition(conditions, "Restarting", "False", reason, message, at) \
        if condition(status, "Restarting") else conditions
    conditions = set_condition(conditions, phase, "True", reason, message, at)
    return {**status, "phase": phase, "conditions": conditions, "completionTime": at}


def _restart(status: dict[str, Any], reason: str, message: str, policy: RunPolicy, at: str,
             disrupted: bool = False) -> dict[str, Any]:
    """Another gang restart; one the cluster caused (``disrupted``) is not counted against backoffLimit."""
    restarts, disruptions = status.get("restarts", 0), status.get("disruptions", 0)
    counted = restarts - disruptions
    if disrupted:
        text = f"gang restart after a disruption (not counted against runPolicy.backoffLimit): {message}"
        disruptions += 1
    elif counted >= policy.backoffLimit:
        return _finish(status, "Failed", "BackoffLimitExceeded",
                       f"{message}; runPolicy.backoffLimit ({policy.backoffLimit}) restarts used", at)
    else:
        text = f"gang restart {counted + 1}/{policy.backoffLimit}: {message}"
    conditions = set_condition(status.get("conditions", []), "Running", "False", reason, text, at)
    conditions = set_condition(conditions, "Restarting", "True", reason, text, at)
    return {**status, "phase": "Restarting", "conditions": conditions, "restarts": restarts + 1} | \
        ({"disruptions": disruptions} if disruptions else {})


def _restart_avoiding(status: dict[str, Any], faults: list[tuple[dict[str, Any], tuple[str, str]]],
                      policy: RunPolicy, at: str) -> dict[str, Any]:
    """A gang restart after pods failed because of their node or device: those nodes join status.avoidedNodes
    (the new pods are kept off them) and the restart is a disruption, not counted against backoffLimit."""
    status = _avoid(status, faults, at)
    pod, (reason, why) = faults[0]
    message = f"pod {pod['metadata']['name']} on node {node_name(pod) or '?'}: {why}"
    if avoided := status.get("avoidedNodes"):
        message += f"; new pods avoid node(s) {', '.join(a['node'] for a in avoided)}"
    return _restart(status, reason, message, policy, at, disrupted=True)


def restart_stalled(status: dict[str, Any], message: str, policy: RunPolicy, at: str) -> dict[str, Any]:
    """A gang restart of a Stalled job. It counts against backoffLimit, as Kubeflow counts every failure it
    restarts: a hang is as often the program's (a deadlock, a collective one rank never reaches) as the
    hardware's, and a job that hangs at the same step every time must end instead of looping. A stall caused by
    a lost node or device shows as that fault, which is a disruption and not counted."""
    return _restart(status, "Stalled", message, policy, at)


def _avoid(status: dict[str, Any], faults: list[tuple[dict[str, Any], tuple[str, str]]], at: str) -> dict[str, Any]:
    """status.avoidedNodes with the nodes of ``faults`` added (each once)."""
    avoided = [dict(a) for a in status.get("avoidedNodes") or []]
    known = {a["node"] for a in avoided}
    for pod, (reason, why) in faults:
        node = node_name(pod)
        if node and node not in known:
            avoided.append({"node": node, "reason": reason, "message": f"pod {pod['metadata']['name']}: {why}",
                            "time": at})
            known.add(node)
    return {**status, "avoidedNodes": avoided} if avoided else status


def _lost_while_running(status: dict[str, Any], ended: list[dict[str, Any]], policy: RunPolicy,
                        at: str) -> dict[str, Any]:
    """A pod of the current gang deleted after it ran (a drain, a preemption, a user, its node lost): its ranks
    are gone from every collective, so the gang restarts; the cluster's reason decides whether it counts against
    backoffLimit."""
    if faults := [(p, f) for p in ended if (f := fault(p))]:
        return _restart_avoiding(status, faults, policy, at)
    if leaving := next(((p, why) for p in ended if (why := disruption(p))), None):
        pod, why = leaving
        return _restart(status, "PodDisrupted", f"pod {pod['metadata']['name']}: {why}", policy, at, True)
    names = ", ".join(p["metadata"]["name"] for p in ended[:3]) + (f" and {len(ended) - 3} more" if len(ended) > 3
                                                                   else "")
    return _restart(status, "PodDeleted", f"pod {names} was deleted while running", policy, at)


def derive(pods: JobPods | list[dict[str, Any]], expected: int, previous: dict[str, Any], policy: RunPolicy | None = None,
           at: dt.datetime | None = None, blocked: str | None = None) -> dict[str, Any]:
    """The next status of a job from the pods of its current attempt (live and terminating), in any phase.

    Every fault of the attempt is read here, whatever the phase: a pod that failed, and a pod deleted that still
    carries the operator's finalizer (its end not yet counted). A pod deleted after it ran restarts the gang (the
    attempt grows by one); a pod deleted before it ran is replaced under its own name by the reconcile, which
    creates every missing index of the current attempt (only a node it failed on is recorded here). ``blocked``
    says why missing pods cannot be created yet (the previous attempt's pods still stopping), for the message.
    The reconcile acts on what changed: ``restarts`` grown -> the older attempts' pods are deleted and the next
    attempt's created once they are gone; a terminal phase -> pods deleted as ``runPolicy.cleanPodPolicy`` says.
    Reads only the counts of ``JobPods`` and the failed, terminating or first pending pods, so it costs O(1) in
    the size of a healthy job.
    """
    if not isinstance(pods, JobPods):
        pods = JobPods(pods)
    policy = policy or RunPolicy()
    stamp = now(at)
    status = {k: v for k, v in previous.items() if k in ("conditions", "startTime", "completionTime", "restarts",
                                                         "disruptions", "progress", "phase", "hostPorts",
                                                         "evaluation", "avoidedNodes", "elastic", "recoveries",
                                                         "goodput", "plan", "tracking")}
    status.setdefault("conditions", [])
    status["replicas"] = counts = pods.replica_counts()
    phase = previous.get("phase")
    if phase in TERMINAL:
        return status
    created = condition(previous, "Created") or {}
    if created.get("status") == "True" and policy.deadline_passed(created.get("lastTransitionTime"),
                                                                    at or dt.datetime.now(dt.timezone.utc)):
        return _finish(status, "Failed", "DeadlineExceeded",
                       f"runPolicy.activeDeadlineSeconds ({policy.activeDeadlineSeconds}) passed", stamp)
    # The pods deleted (or their node lost) whose end is not counted yet: one that had finished before is judged as
    # any finished pod; the others ended because of the deletion.
    ending = [p for p in pods.ending() if held(p)] if pods.terminating else []
    finished_first = [p for p in ending if finished_before_deletion(p)]
    deleted = [p for p in ending if not finished_before_deletion(p)]
    failed = pods.in_phase("Failed") + [p for p in finished_first if p["status"].get("phase") == "Failed"]
    if failed:
        # A node or device fault explains the other ranks' failures too (their peer vanished mid-collective).
        if faults := [(p, f) for p in failed if (f := fault(p))]:
            return _restart_avoiding(status, faults, policy, stamp)
        disrupted = [(p, why) for p in failed if (why := disruption(p))]
        if len(disrupted) == len(failed):
            pod, why = disrupted[0]
            return _restart(status, "PodDisrupted", f"pod {pod['metadata']['name']}: {why}", policy, stamp, True)
        failures = [_failure(p, policy) for p in failed if not disruption(p)]
        # Megatron's rerun state machine asking for a restart (exit 16) explains its peers' plain failures too, and is
        # a step of its own check rather than a failure: not counted against backoffLimit.
        rerun = next((f for f in failures if f[1] == RERUN_REQUESTED), None)
        permanent = next((f for f in failures if not f[0] and not (rerun and f[1] == "PodFailed")), None)
        if permanent:
            return _finish(status, "Failed", permanent[1], permanent[2], stamp)
        _, reason, why = rerun or failures[0]
        return _restart(status, reason, why, policy, stamp, disrupted=rerun is not None)
    if ran := [p for p in deleted if has_run(p)]:
        return _lost_while_running(status, ran, policy, stamp)
    if faults := [(p, f) for p in deleted if (f := fault(p))]:  # never ran: replaced, kept off the node it lost
        status = _avoid(status, faults, stamp)
    conditions = status["conditions"]
    running = pods.count("Running")
    succeeded = pods.count("Succeeded") + sum(p["status"].get("phase") == "Succeeded" for p in finished_first)
    if succeeded == expected:
        message = f"all {expected} pods completed"
        return _finish(status, "Succeeded", "JobSucceeded", message, stamp)
    if running + succeeded == expected:
        status.setdefault("startTime", stamp)
        message = f"{counts['ready']}/{expected} pods ready"
        if phase == "Restarting" or is_true(status, "Restarting"):
            conditions = set_condition(conditions, "Restarting", "False", "PodsRunning",
                                       f"restart {status.get('restarts', 0)} running", stamp)
        conditions = set_condition(conditions, "Running", "True", "PodsRunning", message, stamp)
        return {**status, "phase": "Running", "conditions": conditions}
    ended = deleted  # replaced once gone (the others restarted the gang above)
    missing = expected - pods.live_count - len(ended)
    waiting = pods.first_in_phase("Pending")
    parts = [f"{running}/{expected} pods running"]
    if waiting:
        parts.append(f"{waiting['metadata']['name']}: {_waiting_reason(waiting)}")
    if missing > 0 or ended:
        replacing = f"; replacing {len(ended)} deleted before running" if ended else ""
        parts.append(f"{blocked}" if blocked else f"{max(missing, 0) + len(ended)} of {expected} pods not "
                                                  f"created yet{replacing}")
    message = "; ".join(parts)
    phase = "Restarting" if is_true(status, "Restarting") else "Pending"
    conditions = set_condition(conditions, "Running", "False", "PodsPending" if not blocked else "PodsStopping",
                               message, stamp)
    return {**status, "phase": phase, "conditions": conditions}
