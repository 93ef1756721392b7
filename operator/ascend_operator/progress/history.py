"""Each training job's curves, kept where they survive the operator: a ConfigMap ``<job>-history`` the operator
owns (deleted with the job by its owner reference).

Every iteration the engine logged is in it: rank 0 keeps its own bounded series (``ascend_engine.series``,
served at ``/series``) and the operator merges it in on each progress scrape, so points logged between two
scrapes are not lost; the final report (the termination message) refines the last point. Long runs are thinned
by buckets that keep each bucket's minimum, maximum and last point (see ``ascend_engine.series``).
"""
from __future__ import annotations

import json
from typing import Any

from ascend_engine.series import add_point, merge

from ..api.group import API_GROUP

DATA_KEY = "series.json"
LABEL = f"{API_GROUP}/history-of"


def config_map_name(job: str) -> str:
    return f"{job}-history"


def read(config_map: dict[str, Any] | None) -> list[dict[str, Any]]:
    try:
        return json.loads(((config_map or {}).get("data") or {}).get(DATA_KEY) or "[]")
    except ValueError:
        return []


def record(kube: Any, job: dict[str, Any], progress: dict[str, Any], at: str,
           engine_series: list[dict[str, Any]] | None = None, exact: bool = False) -> int:
    """Merge the engine's series (when the scrape got one) and the progress's figures into the job's history
    ConfigMap (created on the first point); nothing is written when nothing changed. ``exact``: the progress is
    the engine's final report, not a scrape rounded to its significant digits, so it replaces the last point's
    figures (a scrape of the last iteration may have reached the history before the series did). Returns the
    newest iteration the history now holds (0: none)."""
    meta = job["metadata"]
    before = read(kube.get_config_map(meta["namespace"], config_map_name(meta["name"])))
    points = merge(before, engine_series or [])
    iteration = progress.get("iteration")
    if not engine_series or not points or (isinstance(iteration, int) and iteration >= points[-1]["iteration"]):
        # (a scrape's figures older than the engine's newest point are already in its series)
        points = add_point(points, iteration, progress, at, exact=exact) or points
    if points != before:
        kube.update_config_map(meta["namespace"], config_map(job, points))
    return points[-1]["iteration"] if points else 0


def config_map(job: dict[str, Any], points: list[dict[str, Any]]) -> dict[str, Any]:
    meta = job["metadata"]
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": config_map_name(meta["name"]), "namespace": meta["namespace"],
                         "labels": {LABEL: meta["name"]},
                         "ownerReferences": [{"apiVersion": job["apiVersion"], "kind": job["kind"],
                                              "name": meta["name"], "uid": meta["uid"], "controller": True,
                                              "blockOwnerDeletion": True}]},
            "data": {DATA_KEY: json.dumps(points, separators=(",", ":"))}}
