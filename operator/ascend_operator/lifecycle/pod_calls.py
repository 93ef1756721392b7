"""The reconcile's calls on a job's children: create what is missing, delete, force-delete and release pods. Each
goes a few requests at a time (``fan_out``) and writes what the server answered into the pod cache at once, so
the next reconcile sees its own writes before their watch events (a missing pod would otherwise look deleted)."""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import kopf
from kubernetes.client.rest import ApiException

from ascend_engine.node_rank import NODE_RANK_ANNOTATION

from ..api.group import LABEL_ATTEMPT, LABEL_JOB_KIND, LABEL_JOB_NAME, POD_FINALIZER
from ..cache.job_pods import index
from ..cache.pod_cache import JobKey, PodCache
from ..client import fan_out
from ..client.kubeclient import kube
from ..faults import infra_fault
from ..render import gang
from ..kueue import integration as kueue
from . import attempts, create_errors
from .kinds import JobKind
from .status import now


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


def _raise_first(results: list[Any]) -> list[Any]:
    failure = next((r for r in results if isinstance(r, Exception)), None)
    if failure is not None:
        raise failure
    return results


def create(cache: PodCache, job: JobKind, obj: dict[str, Any], spec: Any, attempt: int, indices: list[int],
           others: bool, config: bool, avoided: list[str]) -> list[str]:
    """Create the pods of ``attempt`` at ``indices``, kept off the ``avoided`` nodes; with ``others`` the objects
    the pods use that a job makes once (Service, PodGroup), with ``config`` its ConfigMap (written again for a
    new attempt: a restart or resume may load another checkpoint). Returns 'Kind/name' of what was made."""
    namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    objects = job.render(name, namespace, spec)
    attempts.stamp(objects, name, attempt)
    gang.stamp(objects, name, attempt)
    wanted = set(indices)
    # kube-scheduler's PodGroup is the attempt's own (a pod's schedulingGroup is immutable): asked for with every
    # creation of the attempt's pods (a 409 when it exists), as the Service and a Volcano PodGroup are once a job.
    objects = [o for o in objects if (o["kind"] == "Pod" and index(o) in wanted) or gang.per_attempt(o) or
               (o["kind"] == "ConfigMap" and config) or (o["kind"] not in ("Pod", "ConfigMap") and others)]
    for o in objects:  # the pod stays, with its last status, until its end is counted (``pod_ends.releasable``)
        if o["kind"] == "Pod" and POD_FINALIZER not in (o["metadata"].get("finalizers") or []):
            o["metadata"]["finalizers"] = [*(o["metadata"].get("finalizers") or []), POD_FINALIZER]
    infra_fault.avoid_nodes(objects, avoided)
    kopf.adopt(objects, owner=obj)
    kueue.keep_off_children(objects)
    kueue.apply_admission(job.kind.kind, obj, objects)

    def make(o: dict[str, Any]) -> str | None:
        try:
            if o["kind"] == "ConfigMap":
                kube().update_config_map(namespace, o, exists=not others)
                return None
            made = kube().create(namespace, o)
        except (ApiException, ValueError, TypeError) as e:  # the server's refusal, or the client's before sending
            raise create_errors.ChildCreateFailed(f"{o['kind']}/{o['metadata']['name']}", e) from None
        if made and o["kind"] == "Pod":
            cache.wrote(made)
        return f"{o['kind']}/{o['metadata']['name']}" if made else None

    # The objects the pods use first, side by side, then the pods.
    made: list[Any] = []
    for batch in ([o for o in objects if o["kind"] != "Pod"], [o for o in objects if o["kind"] == "Pod"]):
        made += _raise_first(fan_out.each(make, batch))
    if config and attempt > 0 and any(gang.per_attempt(o) for o in objects):  # older attempts' groups are done
        kube().delete_pod_groups(namespace, f"{LABEL_JOB_KIND}={job.kind.kind},{LABEL_JOB_NAME}={name},"
                                            f"{LABEL_ATTEMPT}!={attempt}")
    return [c for c in made if c]


def delete(cache: PodCache, key: JobKey, pods: list[dict[str, Any]], grace_seconds: int | None = None) -> int:
    """Delete the live ones among ``pods``; the cache counts them as terminating until their events come."""
    doomed = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    at = now()

    def one(p: dict[str, Any]) -> None:
        name, uid = p["metadata"]["name"], p["metadata"]["uid"]
        if kube().delete_pod(key[1], name, uid, grace_seconds):
            cache.deleting(key, name, uid, at)
        else:
            cache.gone(key, name, uid)

    _raise_first(fan_out.each(one, doomed))
    return len(doomed)


def delete_sets(cache: PodCache, key: JobKey, sets: list[tuple[int | None, bool, list[dict[str, Any]]]],
                grace_seconds: int | None = None) -> int:
    """Delete each set (``pod_ends.doomed_sets``) in one request: the job's pods of that attempt (all of them, or
    those not finished), by label and field selector. How many pods were deleted."""
    deleted = 0
    at = now()
    for attempt, unfinished_only, pods in sets:
        if all(p["metadata"].get("deletionTimestamp") for p in pods):
            continue  # asked already: their deletion is under way
        if any(LABEL_ATTEMPT not in (p["metadata"].get("labels") or {}) for p in pods):
            deleted += delete(cache, key, pods, grace_seconds)  # pods from before attempts: no label to select
            continue
        labels = {LABEL_JOB_KIND: key[0], LABEL_JOB_NAME: key[2]}
        if attempt is not None:
            labels[LABEL_ATTEMPT] = str(attempt)
        for pod in kube().delete_pods(key[1], labels, unfinished_only, grace_seconds):
            cache.deleting(key, pod["metadata"]["name"], pod["metadata"]["uid"], at)
            deleted += 1
    return deleted


def force_delete(cache: PodCache, obj: dict[str, Any], key: JobKey, pods: list[dict[str, Any]]) -> None:
    """Delete with no grace the pods evicted from a node that went NotReady or unreachable: no kubelet there will
    confirm their deletion. (Their processes may still run on a node that is only cut off; a new gang does not share
    state with them, and the old ranks' collectives fail.)"""
    def one(p: dict[str, Any]) -> None:
        if kube().delete_pod(key[1], p["metadata"]["name"], p["metadata"]["uid"], grace_seconds=0):
            kube().post_event(obj, "PodForceDeleted", f"pod {p['metadata']['name']} force-deleted: its node "
                                                      f"{infra_fault.node_name(p) or '?'} cannot confirm the deletion")
        else:
            cache.gone(key, p["metadata"]["name"], p["metadata"]["uid"])

    _raise_first(fan_out.each(one, pods))


def annotate_ranks(cache: PodCache, key: JobKey, ranked: list[tuple[dict[str, Any], int]]) -> int:
    """Write each pod's NODE_RANK into its annotation (``ascend_engine.node_rank``, ``topology.placement``); one
    patch a pod, once per attempt."""
    def one(item: tuple[dict[str, Any], int]) -> None:
        pod, rank = item
        answer = kube().annotate_pod_of_uid(key[1], pod["metadata"]["name"], pod["metadata"]["uid"],
                                     {NODE_RANK_ANNOTATION: str(rank)})
        if answer is not None:
            cache.released(answer)  # the pod as it is now: the next pass sees its annotation

    _raise_first(fan_out.each(one, ranked))
    return len(ranked)


class _Released:
    """The uids whose finalizer this process removed (the newest 65,536): the finalizer is added only when a pod
    is created, so a uid released once never needs it again. A pass that still sees the pod with it (a watch event
    written before the release, read after it) asks nothing of the server: without this it sent a second patch
    and got a 404 for a pod already gone, as the Job controller's expectations avoid."""

    def __init__(self, size: int = 65536) -> None:
        self._uids: OrderedDict[str, None] = OrderedDict()
        self._size, self._lock = size, threading.Lock()

    def add(self, uid: str) -> None:
        with self._lock:
            self._uids[uid] = None
            if len(self._uids) > self._size:
                self._uids.popitem(last=False)

    def __contains__(self, uid: str) -> bool:
        with self._lock:
            return uid in self._uids


RELEASED = _Released()


def release(cache: PodCache, key: JobKey, pods: list[dict[str, Any]]) -> int:
    """Remove the operator's finalizer from ``pods`` (their end is counted); one patch a pod, none for a pod
    released before."""
    def one(p: dict[str, Any]) -> None:
        answer = kube().release_pod(key[1], p["metadata"]["name"], p["metadata"]["uid"])
        RELEASED.add(p["metadata"]["uid"])  # released now, or gone / another pod of that name (None)
        if answer is not None:
            cache.released(answer)  # the next snapshot no longer asks for it; its DELETED event removes it

    pods = [p for p in pods if p["metadata"]["uid"] not in RELEASED]
    _raise_first(fan_out.each(one, pods))
    return len(pods)
