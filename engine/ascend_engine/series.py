"""A bounded series of a run's logged figures, one point per logged iteration, for curves.

The engine's rank 0 keeps one (served at ``/series`` next to ``/metrics``) and the operator keeps one per job
(the dashboard's history); both use the functions here, so they agree on what a point is and how a long run
is thinned.

Thinning is by buckets: when a series outgrows its limit, its iterations are cut into equal spans and each
span keeps, for every figure, the point with the smallest and the one with the largest value, plus its last
point. Spikes, dips and the overall shape survive; the newest point always stays; a short run keeps every point.
No value is averaged or invented: every kept point is one the engine logged.
"""
from __future__ import annotations

from typing import Any

# status.progress fields that are curves (the same names in a point); iteration and time are the axes.
SERIES_FIELDS = ("loss", "validationLoss", "learningRate", "tokensPerSecond",
                 # stage figures: GRPO's reward and accuracy, DPO/SimPO's pair accuracy and margin, PRM's step
                 # accuracy, MoE's router loss, GRPO's reward-model score
                 "rewardMean", "accuracy", "rewardAccuracy", "rewardMargin", "stepAccuracy", "loadBalancingLoss",
                 "rewardModelScore")
MAX_POINTS = 1000
Point = dict[str, Any]


def add_point(points: list[Point], iteration: int, figures: dict[str, Any], at: str,
              limit: int = MAX_POINTS, exact: bool = False) -> list[Point] | None:
    """The series with ``figures`` at ``iteration``, or None when nothing changed.

    A point for the last iteration again adds the figures that point lacks (validation loss joins its step; a
    rounded scrape never overwrites the engine's own value), and with ``exact`` (the engine's own figures, e.g. its
    final report) its figures replace that point's; an older iteration means a restart resumed from an older
    checkpoint: the abandoned tail is dropped."""
    figures = {k: v for k, v in figures.items() if k in SERIES_FIELDS and v is not None}
    if not isinstance(iteration, int) or not figures:
        return None
    if points and points[-1]["iteration"] == iteration:
        merged = {**points[-1], **figures} if exact else {**figures, **points[-1]}
        return None if merged == points[-1] else points[:-1] + [merged]
    if points and points[-1]["iteration"] > iteration:
        points = [p for p in points if p["iteration"] < iteration]
    return downsample(points + [{"iteration": iteration, "time": at, **figures}], limit)


def merge(kept: list[Point], newer: list[Point], limit: int = MAX_POINTS) -> list[Point]:
    """``kept`` (what the operator has) followed by ``newer`` (the engine's own series of its current process):
    the engine's points replace everything from its first iteration on."""
    if not newer:
        return kept
    first = newer[0]["iteration"]
    return downsample([p for p in kept if p["iteration"] < first] + list(newer), limit)


def downsample(points: list[Point], limit: int = MAX_POINTS) -> list[Point]:
    """At most ``limit`` points: when over, about half of it in buckets of min, max and last (see the module)."""
    if len(points) <= limit:
        return points
    fields = [f for f in SERIES_FIELDS if any(f in p for p in points)]
    per_bucket = 2 * len(fields) + 1
    buckets = max(1, limit // (2 * per_bucket))
    # Buckets of equal iteration spans, so the kept points spread evenly along the x axis however often the
    # series was thinned before.
    first, span = points[0]["iteration"], points[-1]["iteration"] - points[0]["iteration"] + 1
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(points):
        groups.setdefault((p["iteration"] - first) * buckets // span, []).append(i)
    kept: list[int] = []
    for bucket in groups.values():
        chosen = {bucket[-1]}
        for field in fields:
            having = [i for i in bucket if isinstance(points[i].get(field), (int, float))]
            if having:
                chosen.add(min(having, key=lambda i: points[i][field]))
                chosen.add(max(having, key=lambda i: points[i][field]))
        kept.extend(sorted(chosen))
    return [points[i] for i in kept]
