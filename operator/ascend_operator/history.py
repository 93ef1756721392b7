"""A bounded history of each training job's figures, for curves (the dashboard), kept where it survives the
operator: a ConfigMap ``<job>-history`` the operator owns (deleted with the job by its owner reference).

At most ``MAX_POINTS`` points per job: when full, every other point of the older half is dropped, so a long run
keeps its whole shape at a coarser step while recent points stay dense.
"""
from __future__ import annotations

import json
from typing import Any

from .api.group import API_GROUP

MAX_POINTS = 200
DATA_KEY = "series.json"
LABEL = f"{API_GROUP}/history-of"
# status.progress field -> point field
FIELDS = {"loss": "loss", "validationLoss": "validationLoss", "learningRate": "learningRate",
          "tokensPerSecond": "tokensPerSecond",
          # stage figures: GRPO's reward and accuracy, DPO/SimPO's pair accuracy and margin, PRM's step accuracy,
          # MoE's router loss
          "rewardMean": "rewardMean", "accuracy": "accuracy", "rewardAccuracy": "rewardAccuracy",
          "rewardMargin": "rewardMargin", "stepAccuracy": "stepAccuracy", "loadBalancingLoss": "loadBalancingLoss",
          "rewardModelScore": "rewardModelScore"}


def config_map_name(job: str) -> str:
    return f"{job}-history"


def add_point(points: list[dict[str, Any]], progress: dict[str, Any], at: str) -> list[dict[str, Any]] | None:
    """The series with the progress's figures at its iteration, or None when there is nothing new."""
    iteration = progress.get("iteration")
    if not isinstance(iteration, int) or not any(progress.get(f) is not None for f in FIELDS):
        return None
    point = {"iteration": iteration, "time": at,
             **{key: progress[f] for f, key in FIELDS.items() if progress.get(f) is not None}}
    if points and points[-1]["iteration"] >= iteration:
        if points[-1]["iteration"] == iteration and points[-1] != {**point, "time": points[-1]["time"]}:
            return points[:-1] + [point]  # the final report refines the last scrape
        if points[-1]["iteration"] > iteration:  # a restart resumed from an older checkpoint: keep the new run
            return [p for p in points if p["iteration"] < iteration] + [point]
        return None
    return downsample(points + [point])


def downsample(points: list[dict[str, Any]], limit: int = MAX_POINTS) -> list[dict[str, Any]]:
    while len(points) > limit:
        half = len(points) // 2
        points = points[:half:2] + points[half:]
    return points


def read(config_map: dict[str, Any] | None) -> list[dict[str, Any]]:
    try:
        return json.loads(((config_map or {}).get("data") or {}).get(DATA_KEY) or "[]")
    except ValueError:
        return []


def record(kube: Any, job: dict[str, Any], progress: dict[str, Any], at: str) -> None:
    """Add the progress to the job's history ConfigMap (created on the first point)."""
    meta = job["metadata"]
    points = add_point(read(kube.get_config_map(meta["namespace"], config_map_name(meta["name"]))), progress, at)
    if points is not None:
        kube.update_config_map(meta["namespace"], config_map(job, points))


def config_map(job: dict[str, Any], points: list[dict[str, Any]]) -> dict[str, Any]:
    meta = job["metadata"]
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": config_map_name(meta["name"]), "namespace": meta["namespace"],
                         "labels": {LABEL: meta["name"]},
                         "ownerReferences": [{"apiVersion": job["apiVersion"], "kind": job["kind"],
                                              "name": meta["name"], "uid": meta["uid"], "controller": True,
                                              "blockOwnerDeletion": True}]},
            "data": {DATA_KEY: json.dumps(points, separators=(",", ":"))}}
