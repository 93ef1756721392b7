"""Which pods a job should not have, which may be created, and which may lose the operator's finalizer: pure
functions of the job's pods and the status the reconcile has just written.

A job's pods span its attempts (``attempts``). The status names the current attempt; from it:

* **doomed**: the live pods that must go: every pod of an older attempt that still waits or runs (a gang restart
  stops the whole gang; the finished pods stay with their logs), the pods of attempts too old to keep, the
  current attempt's while the job is suspended, and at the end those ``runPolicy.cleanPodPolicy`` names;
* **blocking**: why the current attempt's missing pods cannot be created yet: an older attempt's pod (or, when
  resuming, a suspended one) may still run, and a new gang must never meet the old one;
* **missing**: the indices of the current attempt that have no pod at all (never created, or gone);
* **releasable**: the pods whose end the written status accounts for, so the finalizer (``POD_FINALIZER``) can
  go: any pod of a finished job, older attempts' pods that ended or are being deleted, and the current attempt's
  pods deleted before they ran (replaced under the same name) or stopped by a suspension once their last status
  (the checkpoint they saved on SIGTERM) is in;
* **lost**: terminating pods on a node that cannot confirm their deletion.

Each costs O(1) per attempt plus the pods it names, never a walk of a healthy gang.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from ..api.run_policy import RunPolicy, parse_time
from ..cache.job_pods import JobPods, finished, has_run, held, index, terminating
from ..faults.infra_fault import node_fault, node_name
from . import attempts

# A deleted pod whose kubelet never reports its end (a node that vanished without the cluster noticing yet) is
# taken as ended this long after its grace period ran out.
UNCONFIRMED_GRACE_S = 30


def _unfinished(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if not finished(p)]


Doomed = tuple[int | None, bool, list[dict[str, Any]]]  # (attempt or None: all, only unfinished ones, the pods)


def doomed_sets(pods: JobPods, attempt: int, policy: RunPolicy, suspended: bool, terminal: bool) -> list[Doomed]:
    """The live pods to delete now, as sets a label and field selector name (an attempt's pods, all or those not
    finished), so that each set is one request."""
    if terminal:
        clean = policy.pods_to_clean(pods.live())
        return [(None, policy.cleanPodPolicy == "Running", clean)] if clean else []
    out: list[Doomed] = []
    oldest_kept = attempt - attempts.kept(policy.backoffLimit)
    for n in pods.attempt_numbers():
        view = pods.attempt(n)
        if n <= oldest_kept or n > attempt:  # too old to keep; or of an attempt the status does not know (yet)
            out.append((n, False, view.live()))
        elif n < attempt and view.count("Pending") + view.count("Running"):
            out.append((n, True, _unfinished(view.live())))
        elif n == attempt and suspended:
            out.append((n, False, view.live()))
    return [d for d in out if d[2]]


def doomed(pods: JobPods, attempt: int, policy: RunPolicy, suspended: bool, terminal: bool) -> list[dict[str, Any]]:
    """The live pods to delete now."""
    return [p for _, _, of_set in doomed_sets(pods, attempt, policy, suspended, terminal) for p in of_set]


def may_run(pod: dict[str, Any]) -> bool:
    """Whether a process of this pod may still run: it has not finished, or it is being deleted and its node
    could still be running it."""
    return not finished(pod)


def blocking(pods: JobPods, attempt: int, resuming: bool) -> str | None:
    """Why the current attempt's missing pods cannot be created now, or None: a pod of another attempt (or of this
    one, stopped by the suspension being undone) is still there and may still run."""
    waiting: list[dict[str, Any]] = []
    for n in pods.attempt_numbers():
        if n == attempt and not resuming:
            continue
        view = pods.attempt(n)
        if view.terminating or view.count("Pending") + view.count("Running"):
            waiting += [p for p in view if may_run(p) or terminating(p)]
    if not waiting:
        return None
    names = ", ".join(p["metadata"]["name"] for p in waiting[:3]) + (f" and {len(waiting) - 3} more"
                                                                      if len(waiting) > 3 else "")
    what = "stopped by the suspension" if resuming else "of the previous attempt"
    return f"waiting for {len(waiting)} pod(s) {what} to stop ({names})"


def missing(current: JobPods, expected: int) -> list[int]:
    """Indices of the current attempt without a pod of their name (live or still terminating). An attempt's pods
    all have indices below its size (a resize starts a new attempt), so a full count means none is missing."""
    if len(current) >= expected:
        return []
    present = {index(p) for p in current}
    return [i for i in range(expected) if i not in present]


def confirmed_or_unconfirmable(pod: dict[str, Any], now: dt.datetime) -> bool:
    """Whether a terminating pod's last status is in, or will never come: it finished, it never ran, it has no
    node or its node is lost, it was force-deleted, or its grace period ran out long ago."""
    meta = pod["metadata"]
    if finished(pod) or not has_run(pod) or not node_name(pod) or node_fault(pod):
        return True
    grace = meta.get("deletionGracePeriodSeconds")
    if grace == 0:
        return True
    try:
        since = parse_time(meta["deletionTimestamp"])
    except (KeyError, ValueError):
        return True
    return (now - since).total_seconds() > (grace or 0) + UNCONFIRMED_GRACE_S


def releasable(pods: JobPods, attempt: int, terminal: bool, suspended: bool,
               now: dt.datetime | None = None) -> list[dict[str, Any]]:
    """The pods whose finalizer can go now that the status is written."""
    if not pods.held_count:
        return []
    if terminal:  # everything is counted: no finalizer outlives the job's end
        return [p for p in pods if held(p)]
    now = now or dt.datetime.now(dt.timezone.utc)
    out: list[dict[str, Any]] = []
    for n in pods.attempt_numbers():
        view = pods.attempt(n)
        if not view.held_count:
            continue
        if n != attempt:
            out += [p for p in view if held(p) and (terminating(p) or finished(p))]
        elif view.terminating:
            out += [p for p in view.ending() if held(p) and
                    (not has_run(p) or (suspended and confirmed_or_unconfirmable(p, now)))]
    return out


def replaced(pods: JobPods, attempt: int, suspended: bool) -> list[dict[str, Any]]:
    """The current attempt's pods deleted before they ran, whose end is not counted yet: each is replaced by a
    new pod of the same name once it is gone."""
    if suspended:
        return []
    view = pods.attempt(attempt)
    return [p for p in view.ending() if held(p) and not has_run(p)] if view.terminating else []


def lost(pods: JobPods) -> list[dict[str, Any]]:
    """Terminating pods evicted from a node that went NotReady or unreachable: no kubelet there will confirm their
    deletion, so they would hold up the next attempt for ever unless force-deleted."""
    if not pods.terminating:
        return []
    return [p for p in pods.ending() if node_fault(p) and p["metadata"].get("deletionGracePeriodSeconds") != 0]
