"""Read rank 0's Prometheus endpoint into ``status.progress`` (names from ascend_engine.telemetry)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from ascend_engine.telemetry import EVENTS_PATH, GOODPUT_METRICS, METRIC_NAMES, SERIES_PATH, TRACKING_PATH

_INTEGER_FIELDS = {"iteration", "trainIters", "lastCheckpointIteration", "numericRollbacks", "skippedSamples",
                   "skippedWindowIteration", "skippedWindowFirstSample", "skippedWindowEndSample",
                   "loadedIteration", "priorHighWaterIteration", "inPlaceRestarts", "inProcessRestarts",
                   "inProcessLoadedIteration", "inProcessHighWaterIteration", "inProcessSpares"}
_BOOLEAN_FIELDS = {"savingCheckpoint"}
_EXACT_FIELDS = set(GOODPUT_METRICS.values())  # unix times and seconds: rounded to 10 ms, not to 5 digits
SIGNIFICANT_DIGITS = 5  # status is for people and `kubectl get`: 2.3026, 0.0003, 1234.5, not 2.302585092994046


def scrape_series(base_url: str, kept: int, timeout: float = 2.0) -> list[dict] | None:
    """Rank 0's own series of logged points (``/series`` next to ``/metrics``), or None when it does not answer
    (pod starting or gone, or an engine too old to serve it). ``kept``: the newest iteration the job's history
    holds already (0: none), which tells a run waiting at exit that its last points are safe."""
    try:
        with urllib.request.urlopen(f"{base_url}{SERIES_PATH}?kept={kept}", timeout=timeout) as response:
            points = json.loads(response.read().decode())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    if not isinstance(points, list) or not all(isinstance(p, dict) and isinstance(p.get("iteration"), int)
                                               for p in points):
        return None
    return points


def scrape_events(base_url: str, timeout: float = 2.0) -> list[dict]:
    """Rank 0's recent notices (``/events``), each with an "id" unique to it; none when it does not answer."""
    try:
        with urllib.request.urlopen(base_url + EVENTS_PATH, timeout=timeout) as response:
            events = json.loads(response.read().decode())
    except (urllib.error.URLError, OSError, ValueError):
        return []
    if not isinstance(events, list):
        return []
    return [e for e in events if isinstance(e, dict) and isinstance(e.get("id"), str)
            and isinstance(e.get("reason"), str) and isinstance(e.get("message"), str)]


def scrape_tracking(base_url: str, timeout: float = 2.0) -> list[dict]:
    """Where rank 0's experiment trackers keep the run (``/tracking``): tracker, runId, url / location each; none
    when it does not answer or tracks nothing."""
    try:
        with urllib.request.urlopen(base_url + TRACKING_PATH, timeout=timeout) as response:
            runs = json.loads(response.read().decode())
    except (urllib.error.URLError, OSError, ValueError):
        return []
    keys = ("tracker", "runId", "url", "location")
    return [{k: r[k] for k in keys if isinstance(r.get(k), str)} for r in runs if isinstance(r, dict)
            and isinstance(r.get("tracker"), str) and isinstance(r.get("runId"), str)] if isinstance(runs, list) else []


def scrape(url: str, timeout: float = 1.0) -> dict[str, float | int] | None:
    """Progress fields from a metrics URL, or None when it does not answer (pod starting, or gone)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError, ValueError):
        return None
    out: dict[str, float | int] = {}
    for family in text_string_to_metric_families(text):
        field = METRIC_NAMES.get(family.name)
        if field and family.samples:
            value = family.samples[0].value
            out[field] = (bool(value) if field in _BOOLEAN_FIELDS else int(value) if field in _INTEGER_FIELDS
                          else round(value, 2) if field in _EXACT_FIELDS else float(f"{value:.{SIGNIFICANT_DIGITS}g}"))
    return out
