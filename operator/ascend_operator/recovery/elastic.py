"""Elastic data parallelism: the size an AscendTrainJob with ``spec.elastic`` runs at, and when it changes.

Pure decisions over the job's status, its pods and a count of the pods the cluster can hold (``capacity``):

- scale in: a pod of the job has been unschedulable (PodScheduled False, reason Unschedulable) for longer than
  ``elastic.scaleInTimeoutSeconds``: restart at the largest allowed size the cluster holds, or one size smaller
  than now when the count says the pods fit yet the scheduler disagrees (affinity, spread: what the count does not
  model);
- scale out: the job runs below ``nnodes`` and the cluster holds a larger allowed size: note the newest
  checkpoint, and once a newer one exists restart at the largest allowed size the cluster holds.

A resize is a gang restart from the last checkpoint with the pods rendered at the new NNODES / WORLD_SIZE; the engine
keeps the global batch (more micro-batches per step) and reshards the distributed optimizer on load. Resizes are
counted in ``status.elastic.resizes``, not in ``restarts``, so they never use up ``runPolicy.backoffLimit``.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Callable

from ..api.run_policy import parse_time
from ..api.train_job import AscendTrainJobSpec
from ..cache.job_pods import JobPods
from ..lifecycle.status import set_condition

SCALED_IN, SCALED_OUT = "ScaledIn", "ScaledOut"


def current_nodes(spec: AscendTrainJobSpec, status: dict[str, Any]) -> int:
    """The size to render the pods at: the status's, kept within the spec's range."""
    current = (status.get("elastic") or {}).get("currentNodes") or spec.nnodes
    return max(min(current, spec.nnodes), spec.elastic.minNodes) if spec.elastic else spec.nnodes


def prepare(spec: AscendTrainJobSpec, status: dict[str, Any]) -> tuple[AscendTrainJobSpec, dict[str, Any]]:
    """The spec with nnodes at the current size, and status.elastic to record (empty without spec.elastic)."""
    if spec.elastic is None:
        return spec, {}
    current = current_nodes(spec, status)
    block = {**(status.get("elastic") or {}), "desiredNodes": spec.nnodes, "currentNodes": current,
             "nodes": f"{current}/{spec.nnodes}"}
    return spec.model_copy(update={"nnodes": current}), {"elastic": block}


def unschedulable_since(pods: JobPods) -> str | None:
    """When the job's longest-unschedulable pending pod became so (None: none is)."""
    if not pods.count("Pending"):
        return None
    times = [c.get("lastTransitionTime") or "" for p in pods.in_phase("Pending")
             for c in (p.get("status") or {}).get("conditions") or []
             if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"]
    return min(times) if times else None


def _largest(sizes: list[int], at_most: int) -> int | None:
    return next((s for s in sizes if s <= at_most), None)


def _without_scale_out(block: dict[str, Any]) -> dict[str, Any]:
    """The change that drops a noted scale-out: null, since the status is written as a merge patch."""
    return {"scaleOutAfterCheckpoint": None} if block.get("scaleOutAfterCheckpoint") is not None else {}


def _resized(status: dict[str, Any], target: int, reason: str, message: str, at: str) -> dict[str, Any]:
    block = status["elastic"]
    elastic = {**block, "currentNodes": target, "nodes": f"{target}/{block['desiredNodes']}",
               "resizes": block.get("resizes", 0) + 1} | _without_scale_out(block)
    conditions = set_condition(status.get("conditions", []), "Running", "False", reason, message, at)
    conditions = set_condition(conditions, "Restarting", "True", reason, message, at)
    conditions = set_condition(conditions, "Resized", "True", reason, message, at)
    return {**status, "phase": "Restarting", "conditions": conditions, "elastic": elastic}


def resize(spec: AscendTrainJobSpec, status: dict[str, Any], pods: JobPods, capacity: Callable[[], int | None],
           at: dt.datetime) -> tuple[dict[str, Any], str, str] | None:
    """(new status, reason, message) when the job should restart at another size now; (new status, "", "") when
    only status.elastic changes (a scale-out noted or called off); None otherwise.

    ``spec`` is the job's own (nnodes: the desired size); ``status`` the one just derived, with status.elastic;
    ``capacity()`` counts the job's pods the cluster can hold, None when it cannot tell (listing nodes and pods:
    called only when needed).
    """
    if spec.elastic is None or status.get("phase") not in ("Pending", "Running", "Restarting") or pods.terminating:
        return None
    block = status["elastic"]
    current, sizes, stamp = block["currentNodes"], spec.elastic_sizes(), at.strftime("%Y-%m-%dT%H:%M:%SZ")
    since = unschedulable_since(pods)
    if since and (at - parse_time(since)).total_seconds() >= spec.elastic.scaleInTimeoutSeconds:
        smaller = [s for s in sizes if s < current]
        if not smaller:
            return None  # at elastic.minNodes already: the pods wait for the scheduler, Running says why
        fit = capacity()
        if fit is None or fit >= current:  # the count cannot tell, or the scheduler sees what it does not: one step
            target, held = smaller[0], "the scheduler does not place them all"
        else:
            target, held = _largest(smaller, fit) or smaller[-1], f"the cluster holds {fit} of this job's pods"
        message = (f"{current} -> {target} pods: a pod has been unschedulable since {since} (over "
                   f"elastic.scaleInTimeoutSeconds {spec.elastic.scaleInTimeoutSeconds}s) and {held}; restarting "
                   "from the last checkpoint with the same global batch")
        return _resized(status, target, SCALED_IN, message, stamp), SCALED_IN, message
    if current >= spec.nnodes or status.get("phase") != "Running" or since:
        return None
    fit = capacity()
    target = None if fit is None else _largest(sizes, fit)
    if target is None or target <= current:
        if block.get("scaleOutAfterCheckpoint") is not None:  # the capacity went away again
            return {**status, "elastic": block | _without_scale_out(block)}, "", ""
        return None
    checkpoint = (status.get("progress") or {}).get("lastCheckpointIteration") or 0
    noted = block.get("scaleOutAfterCheckpoint")
    if noted is None:
        return {**status, "elastic": {**block, "scaleOutAfterCheckpoint": checkpoint}}, "", ""
    if checkpoint <= noted:
        return None
    message = (f"{current} -> {target} pods: the cluster holds {fit} of this job's pods again; restarting from the "
               f"checkpoint at iteration {checkpoint} with the same global batch")
    return _resized(status, target, SCALED_OUT, message, stamp), SCALED_OUT, message
