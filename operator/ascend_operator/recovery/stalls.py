"""Acting on a stall (``ascend_operator.recovery.stall_clock`` decides): ask every rank for its stacks, then gang-restart.

Stacks without pods/exec: the operator sets ``ascend_engine.stacks.STACK_DUMP_ANNOTATION`` on the job's pods, the
kubelet refreshes each pod's downwardAPI file of annotations, and the engine processes watching it dump every
thread's stack to their log (rank 0 also as a StackDump event). The restart follows ``stackDumpSeconds`` later,
the kubelet's refresh being periodic (about a minute on a real cluster).
"""
from __future__ import annotations

import time
from typing import Any

from ascend_engine.stacks import STACK_DUMP_ANNOTATION

from ..lifecycle import attempts
from .. import metrics
from ..api.run_policy import RunPolicy, StallDetection
from ..cache.job_pods import JobPods
from ..cache.pod_cache import JobKey
from .stall_clock import StallClock, stalled
from ..lifecycle.status import condition, restart_stalled, set_condition
from ..client.kubeclient import kube

# A stalled gang cannot finish its step, so SIGTERM's save-and-exit cannot happen: its pods get this grace period
# instead of terminationGracePeriodSeconds (torchrun would otherwise wait that long before killing the ranks).
STALLED_GRACE_SECONDS = 5
PROGRESSING = "Progressing"  # False (reason Stalled) while hung, True once the iteration advances again

_CLOCKS: dict[JobKey, StallClock] = {}


def forget(key: JobKey) -> None:
    _CLOCKS.pop(key, None)


def check(key: JobKey, obj: dict[str, Any], detection: StallDetection | None, policy: RunPolicy, pods: JobPods,
          status: dict[str, Any], fresh: dict[str, Any] | None, at: str) -> dict[str, Any]:
    """The status after one reading of rank 0's ``fresh`` figures (None: it did not answer): unchanged, with a
    ``Progressing=False`` condition (reason Stalled: stacks asked for), or restarting (``restarts`` grown: the caller
    deletes the pods). The condition is ``Progressing``, as a Deployment's is, not ``Stalled``: kstatus (Flux, the
    chart's Argo CD check) reads ``Stalled=True`` as failed for good, which a hang that a restart may cure is not
    (``ascend_operator.lifecycle.kstatus``)."""
    if detection is None or status.get("phase") != "Running":
        forget(key)
        return status
    now_s = time.monotonic()
    generation = attempts.current(status)  # a new gang (restart or resize) starts a new clock
    clock = _CLOCKS.get(key)
    if clock is None or clock.generation != generation:
        clock = _CLOCKS[key] = StallClock(generation, now_s)
    fresh = fresh or {}
    if clock.observe(fresh.get("iteration"), bool(fresh.get("savingCheckpoint")), now_s, fresh.get("trainIters")):
        if (condition(status, PROGRESSING) or {}).get("status") == "False":
            conditions = set_condition(status["conditions"], PROGRESSING, "True", "Progressing",
                                       f"iteration {clock.iteration} reached after the restart", at)
            status = {**status, "conditions": conditions}
        return status
    why = stalled(detection, clock, now_s)
    if why is None:
        return status
    if clock.dump_requested_at is None:
        clock.dump_requested_at = now_s
        metrics.STALLS.labels(key[0]).inc()
        asked = _ask_for_stacks(key[1], pods, f"{generation}-{at}")
        message = (f"{why}; asked {asked} pod(s) for every rank's Python stacks (each pod's log); gang restart in "
                   f"{detection.stackDumpSeconds}s")
        kube().post_event(obj, "Stalled", message, warning=True)
        conditions = set_condition(status["conditions"], PROGRESSING, "False", "Stalled", message, at)
        return {**status, "conditions": conditions}
    if now_s - clock.dump_requested_at < detection.stackDumpSeconds:
        return status
    forget(key)
    return restart_stalled(status, f"stalled: {why}", policy, at)


def _ask_for_stacks(namespace: str, pods: JobPods, request: str) -> int:
    running = [p for p in pods.live() if (p.get("status") or {}).get("phase") == "Running"]
    return sum(kube().annotate_pod(namespace, p["metadata"]["name"], {STACK_DUMP_ANNOTATION: request})
               for p in running)
