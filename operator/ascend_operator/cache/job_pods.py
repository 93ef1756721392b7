"""One job's pods, slimmed to what the operator reads, with counts kept up to date on every change.

A 4096-node job has 4096 pods and each watch event changes one of them; recounting all of them per event made a
gang restart cost O(N^2). ``JobPods`` keeps the counts ``status.derive`` needs (live pods by phase, ready,
terminating, failed and pending names) and updates them in O(1) per pod change, so deciding a job's status costs
O(1) plus the few failed or pending pods it names. Pods are kept slim (``slim``): the fields the status, the
failure cause and the progress scrape read, about 1 KB a pod instead of the 5-10 KB of a full pod dict.

A job's pods span its attempts (``attempts``: each gang restart creates pods under new names and keeps the failed
ones); ``attempt(n)`` is the view of one attempt, with its own counts, kept up to date the same way.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from ascend_engine.node_rank import NODE_RANK_ANNOTATION

from ..lifecycle import attempts
from ..api.group import LABEL_ATTEMPT, LABEL_JOB_KIND, LABEL_JOB_NAME, LABEL_REPLICA_INDEX, POD_FINALIZER

PHASES = ("Pending", "Running", "Succeeded", "Failed")
_CONDITIONS = ("Ready", "PodScheduled", "DisruptionTarget")  # the last: disruption.py; PodScheduled's time: elastic.py


def _slim_container(cs: dict[str, Any]) -> dict[str, Any]:
    state = cs.get("state") or {}
    # finishedAt: when a failure happened, the start of its recovery's detection (goodput.py)
    kept = {k: {f: v for f, v in (state.get(k) or {}).items() if f in ("exitCode", "reason", "message", "finishedAt")}
            for k in ("terminated", "waiting") if state.get(k)}
    if state.get("running") is not None:  # that it started (has_run), not when
        kept["running"] = {}
    return {"state": kept}


def slim(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as the operator reads it: same shape as the API's, fewer fields."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    labels = meta.get("labels") or {}
    out_meta = {"name": meta.get("name"), "uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion"),
                "labels": {k: labels[k] for k in (LABEL_JOB_NAME, LABEL_JOB_KIND, LABEL_REPLICA_INDEX, LABEL_ATTEMPT)
                           if k in labels}}
    if meta.get("deletionTimestamp"):
        out_meta["deletionTimestamp"] = meta["deletionTimestamp"]
        if meta.get("deletionGracePeriodSeconds") is not None:  # 0: forced, nobody will confirm it
            out_meta["deletionGracePeriodSeconds"] = meta["deletionGracePeriodSeconds"]
    if meta.get("finalizers"):
        out_meta["finalizers"] = list(meta["finalizers"])
    if (rank := (meta.get("annotations") or {}).get(NODE_RANK_ANNOTATION)) is not None:  # topology.placement
        out_meta["annotations"] = {NODE_RANK_ANNOTATION: rank}
    out_status = {k: status[k] for k in ("phase", "podIP", "reason", "message") if status.get(k)}
    conditions = [{k: c[k] for k in ("type", "status", "reason", "message", "lastTransitionTime") if k in c}
                  for c in status.get("conditions") or [] if c.get("type") in _CONDITIONS]
    if conditions:
        out_status["conditions"] = conditions
    if status.get("containerStatuses"):
        out_status["containerStatuses"] = [_slim_container(cs) for cs in status["containerStatuses"]]
    slimmed = {"metadata": out_meta, "status": out_status}
    if (pod.get("spec") or {}).get("nodeName"):  # which node to avoid when it fails (infra_fault.py)
        slimmed["spec"] = {"nodeName": pod["spec"]["nodeName"]}
    return slimmed


def index(pod: dict[str, Any]) -> int:
    return int(pod["metadata"].get("labels", {}).get(LABEL_REPLICA_INDEX, 0))


def phase(pod: dict[str, Any]) -> str:
    return pod.get("status", {}).get("phase", "Pending")


def ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in pod.get("status", {}).get("conditions") or [])


def terminating(pod: dict[str, Any]) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def held(pod: dict[str, Any]) -> bool:
    """Whether the pod still carries the operator's finalizer (``POD_FINALIZER``)."""
    return POD_FINALIZER in (pod["metadata"].get("finalizers") or ())


def finished(pod: dict[str, Any]) -> bool:
    return phase(pod) in ("Succeeded", "Failed")


def has_run(pod: dict[str, Any]) -> bool:
    """Whether a container of the pod ever started (a pod that never ran can be replaced without its gang
    noticing: no rank has met it). A kubelet marks a pod deleted before its container started Failed, with no
    exit code (or ContainerStatusUnknown): that one never ran either."""
    if phase(pod) in ("Running", "Succeeded"):
        return True
    for cs in pod.get("status", {}).get("containerStatuses") or []:
        state = cs.get("state") or {}
        term = state.get("terminated") or {}
        if "running" in state or (term.get("exitCode") is not None and term.get("reason") != "ContainerStatusUnknown"):
            return True
    return False


def finished_before_deletion(pod: dict[str, Any]) -> bool:
    """Whether a terminating pod's container had ended before the pod was deleted: its end is its own (an exit code
    to judge), not the deletion's SIGTERM. Times are whole seconds: an end in the second of the deletion is the
    deletion's."""
    if not finished(pod):
        return False
    ends = [term["finishedAt"] for cs in pod.get("status", {}).get("containerStatuses") or []
            if (term := (cs.get("state") or {}).get("terminated") or {}).get("finishedAt")]
    deleted = pod["metadata"].get("deletionTimestamp")
    return bool(ends and deleted and max(ends) < deleted)  # RFC 3339 UTC strings order as times


class JobPods:
    """The pods of one job by name, with the live ones (not being deleted) indexed by phase; with ``by_attempt``
    also each attempt's pods as a JobPods of their own."""

    def __init__(self, pods: Iterable[dict[str, Any]] = (), by_attempt: bool = True) -> None:
        self._pods: dict[str, dict[str, Any]] = {}
        self._by_phase: dict[str, set[str]] = {ph: set() for ph in PHASES}
        self._ready = 0
        self._terminating = 0
        self._ending: dict[str, set[str]] = {ph: set() for ph in PHASES}  # the terminating pods, by last phase
        self._held = 0
        self._attempts: dict[int, JobPods] | None = {} if by_attempt else None
        for p in pods:
            self.put(p)

    def copy(self) -> JobPods:
        """A snapshot that later changes to this one do not touch (pods are replaced, never mutated)."""
        other = JobPods.__new__(JobPods)
        other._pods = dict(self._pods)
        other._by_phase = {ph: set(names) for ph, names in self._by_phase.items()}
        other._ready, other._terminating, other._held = self._ready, self._terminating, self._held
        other._ending = {ph: set(names) for ph, names in self._ending.items()}
        other._attempts = None if self._attempts is None else {n: a.copy() for n, a in self._attempts.items()}
        return other

    # -- changes -------------------------------------------------------------------------------

    def _count(self, pod: dict[str, Any], sign: int) -> None:
        name = pod["metadata"]["name"]
        self._held += sign * held(pod)
        if terminating(pod):
            self._terminating += sign
            ending = self._ending.setdefault(phase(pod), set())
            ending.add(name) if sign > 0 else ending.discard(name)
            return
        names = self._by_phase.setdefault(phase(pod), set())
        names.add(name) if sign > 0 else names.discard(name)
        self._ready += sign * ready(pod)

    def put(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        old = self._pods.get(name)
        if old is not None:
            self._count(old, -1)
            if self._attempts is not None and attempts.of(old) != attempts.of(pod):
                self._drop_from_attempt(old)
        self._pods[name] = pod
        self._count(pod, +1)
        if self._attempts is not None:
            self._attempts.setdefault(attempts.of(pod), JobPods(by_attempt=False)).put(pod)

    def remove(self, name: str) -> dict[str, Any] | None:
        old = self._pods.pop(name, None)
        if old is not None:
            self._count(old, -1)
            if self._attempts is not None:
                self._drop_from_attempt(old)
        return old

    def _drop_from_attempt(self, pod: dict[str, Any]) -> None:
        n = attempts.of(pod)
        view = self._attempts.get(n)
        if view is not None:
            view.remove(pod["metadata"]["name"])
            if not len(view):
                del self._attempts[n]

    # -- reads ---------------------------------------------------------------------------------

    def get(self, name: str) -> dict[str, Any] | None:
        return self._pods.get(name)

    def attempt(self, n: int) -> JobPods:
        """The pods of attempt ``n`` alone (a view to read: changes go to this JobPods)."""
        if self._attempts is None:
            raise TypeError("a view of one attempt has no attempts of its own")
        return self._attempts.get(n) or JobPods(by_attempt=False)

    def attempt_numbers(self) -> list[int]:
        return sorted(self._attempts or ())

    def __len__(self) -> int:
        return len(self._pods)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(list(self._pods.values()))

    @property
    def terminating(self) -> int:
        return self._terminating

    @property
    def held_count(self) -> int:
        """Pods that carry the operator's finalizer."""
        return self._held

    def ending(self, *phases: str) -> list[dict[str, Any]]:
        """The terminating pods whose last phase is one of ``phases`` (all phases if none), by replica index:
        O(terminating pods)."""
        names = [n for ph in (phases or PHASES) for n in self._ending.get(ph, ())]
        return sorted((self._pods[n] for n in names), key=index)

    @property
    def live_count(self) -> int:
        return len(self._pods) - self._terminating

    def live(self) -> list[dict[str, Any]]:
        return [p for p in self._pods.values() if not terminating(p)]

    def count(self, phase_: str) -> int:
        return len(self._by_phase.get(phase_, ()))

    def in_phase(self, phase_: str) -> list[dict[str, Any]]:
        """The live pods in one phase, by replica index: O(pods in that phase)."""
        return sorted((self._pods[n] for n in self._by_phase.get(phase_, ())), key=index)

    def first_in_phase(self, phase_: str) -> dict[str, Any] | None:
        names = self._by_phase.get(phase_, ())
        return min((self._pods[n] for n in names), key=index) if names else None

    def replica_counts(self) -> dict[str, int]:
        """Pending or running (``active``) and ready among the live pods; succeeded and failed among all (a pod
        deleted after it finished still finished)."""
        return {"active": self.count("Pending") + self.count("Running"), "ready": self._ready,
                "succeeded": self.count("Succeeded") + len(self._ending["Succeeded"]),
                "failed": self.count("Failed") + len(self._ending["Failed"])}

    def live_indexes(self) -> set[int]:
        return {index(p) for p in self.live()}
