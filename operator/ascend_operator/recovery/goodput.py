"""``status.recoveries`` and ``status.goodput`` from the operator's decisions and rank 0's figures (pure functions).

A recovery is opened when it begins: by the operator for a gang restart (Replace) or an elastic resize (Resize),
or, for an in-place restart the operator never sees, when rank 0's figures show the pods' agents restarted the
workers (InPlace), or that the ranks restarted the training function in their processes (InProcess: rank 0
reports every mark of it at once, at its first step after the restart, and when it has caught up). Its parts fill in as the times become known: the old pods gone (the next attempt's pods are
created), the new engine process's start-up marks, and the moment it trained past the earlier high-water
iteration, which closes it with ``totalSeconds``. ``status.goodput`` puts the job's wall time into productive
training, recoveries and the rest.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from ascend_engine.telemetry import GOODPUT_METRICS

from ..api.recovery import MAX_RECOVERIES, RecoveryParts

_FIGURES = set(GOODPUT_METRICS.values())


def stamp(at: float) -> str:
    """RFC 3339 with milliseconds: the parts are computed back from it."""
    return dt.datetime.fromtimestamp(at, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def seconds_of(text: str) -> float:
    text = text.rstrip("Z")
    fmt = "%Y-%m-%dT%H:%M:%S.%f" if "." in text else "%Y-%m-%dT%H:%M:%S"
    return dt.datetime.strptime(text, fmt).replace(tzinfo=dt.timezone.utc).timestamp()


def _finished_at(pods: list[dict[str, Any]]) -> float | None:
    """When the first of the failed pods' containers ended."""
    ends = [seconds_of(term["finishedAt"]) for p in pods for cs in p.get("status", {}).get("containerStatuses") or []
            if (term := (cs.get("state") or {}).get("terminated")) and term.get("finishedAt")]
    return min(ends) if ends else None


def _high_water(status: dict[str, Any]) -> int:
    return max((status.get("goodput") or {}).get("highWaterIteration") or 0,
               (status.get("progress") or {}).get("iteration") or 0)


def begin(status: dict[str, Any], level: str, reason: str, message: str, at: float,
          failed_pods: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """A gang restart or resize the operator decided at ``at``: a new open recovery."""
    failed = _finished_at(list(failed_pods))
    failed = failed if failed is not None and failed <= at else at
    entry = {"level": level, "reason": reason, "message": message[:400], "time": stamp(at),
             "seconds": {"detection": round(at - failed, 2)}, "highWaterIteration": _high_water(status)}
    return _append(status, entry)


def old_pods_gone(status: dict[str, Any], at: float) -> dict[str, Any]:
    """The next attempt's pods are being created: the open Replace/Resize recovery's stopping ends."""
    recoveries = [dict(r) for r in status.get("recoveries") or []]
    if recoveries and recoveries[-1]["level"] not in ("InPlace", "InProcess") and \
            "stopping" not in recoveries[-1]["seconds"]:
        last = recoveries[-1]
        last["seconds"] = {**last["seconds"], "stopping": round(max(0.0, at - seconds_of(last["time"])), 2)}
        return {**status, "recoveries": recoveries}
    return status


_PARTS = tuple(RecoveryParts.model_fields)  # in the order they happen


def _failed_at(recovery: dict[str, Any]) -> float:
    return seconds_of(recovery["time"]) - recovery["seconds"].get("detection", 0.0)


def _append(status: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    kept = [dict(r) for r in status.get("recoveries") or []]
    if kept and kept[-1].get("totalSeconds") is None:
        kept[-1] = _interrupted(kept[-1], _failed_at(entry))
    return {**status, "recoveries": (kept + [entry])[-MAX_RECOVERIES:]}


def _interrupted(recovery: dict[str, Any], failed: float) -> dict[str, Any]:
    """A recovery the next failure cut short ends there: the part it was in gets the rest of its time, so its
    parts still add up to its total (and the job's recovery seconds do not count the overlap twice)."""
    parts = dict(recovery["seconds"])
    total = round(max(0.0, failed - _failed_at(recovery)), 2)
    current = next((p for p in _PARTS if p not in parts), None)
    if current is not None:
        parts[current] = round(max(0.0, total - sum(parts.values())), 2)
    return {**recovery, "seconds": parts, "totalSeconds": total}


def fold(status: dict[str, Any], at: float) -> dict[str, Any]:
    """Move rank 0's goodput figures out of ``status.progress`` into the recoveries and ``status.goodput``."""
    progress = dict(status.get("progress") or {})
    figures = {k: progress.pop(k) for k in list(progress) if k in _FIGURES}
    out = {**status, "progress": progress} if status.get("progress") is not None else dict(status)
    goodput = dict(out.get("goodput") or {})
    if figures.get("inPlaceRestarts", 0) > goodput.get("inPlaceRestarts", 0) and "failedTime" in figures:
        out = _append(out, _in_place(figures, _high_water(out)))
    if "inProcessRestarts" in figures:
        if figures["inProcessRestarts"] > (goodput.get("inProcessRestarts") or 0) and \
                "inProcessFailedTime" in figures:
            out = _append(out, _in_process(figures, _high_water(out)))
        goodput["inProcessRestarts"] = int(figures["inProcessRestarts"])  # per attempt: a gang restart starts at 0
        out = _fill_in_process(out, figures)
    if "processStartTime" in figures:
        goodput["inPlaceRestarts"] = figures.get("inPlaceRestarts", 0)
        out = _fill(out, figures)
        goodput.update(_productive(goodput, figures))
    goodput["highWaterIteration"] = _high_water(out)
    return {**out, "goodput": _totals(out, goodput, at)}


def _in_place(figures: dict[str, Any], high_water: int) -> dict[str, Any]:
    failed = figures["failedTime"]
    detected = figures.get("detectedTime", failed)
    stopped = figures.get("stoppedTime", detected)
    return {"level": "InPlace", "reason": "WorkerFailed", "message": "torchrun's agents restarted the workers in "
            "every pod; no pod was replaced", "time": stamp(detected),
            "seconds": {"detection": round(detected - failed, 2), "stopping": round(stopped - detected, 2)},
            "highWaterIteration": high_water}


_IN_PROCESS_MARKS = (("detection", "inProcessFailedTime", "inProcessDetectedTime"),
                     ("stopping", "inProcessDetectedTime", "inProcessStoppedTime"),
                     ("podStart", "inProcessStoppedTime", "inProcessRejoinedTime"),
                     ("rendezvous", "inProcessRejoinedTime", "inProcessJoinedTime"),
                     ("checkpointLoad", "inProcessJoinedTime", "inProcessFirstStepTime"),
                     ("retrain", "inProcessFirstStepTime", "inProcessCaughtUpTime"))


def _in_process(figures: dict[str, Any], high_water: int) -> dict[str, Any]:
    """An in-process restart, from rank 0's marks of it (``ascend_engine.inprocess``)."""
    failed = figures["inProcessFailedTime"]
    detected = figures.get("inProcessDetectedTime", failed)
    spares = int(figures.get("inProcessSpares") or 0)
    source = "host memory" if figures.get("inProcessFromMemory") else "the shared checkpoint"
    replaced = f"{spares} warm spare(s) took a dead process's place and " if spares else ""
    entry = {"level": "InProcess", "reason": "WorkerFailed", "time": stamp(detected), "seconds": {},
             "message": f"{replaced}the ranks restarted the training function in their own processes; the "
                        f"checkpoint came from {source}; no pod or process was started",
             "highWaterIteration": int(figures.get("inProcessHighWaterIteration", high_water))}
    return _in_process_parts(entry, figures)


def _in_process_parts(entry: dict[str, Any], figures: dict[str, Any]) -> dict[str, Any]:
    parts = dict(entry["seconds"])
    for part, begin, end in _IN_PROCESS_MARKS:
        if figures.get(begin) is not None and figures.get(end) is not None:
            parts[part] = round(max(0.0, figures[end] - figures[begin]), 2)
    entry = {**entry, "seconds": parts}
    if "inProcessLoadedIteration" in figures:
        entry["fromIteration"] = int(figures["inProcessLoadedIteration"])
        entry["lostIterations"] = max(0, entry["highWaterIteration"] - entry["fromIteration"])
    if "retrain" in parts:
        entry["totalSeconds"] = round(sum(parts.values()), 2)
    return entry


def _fill_in_process(status: dict[str, Any], figures: dict[str, Any]) -> dict[str, Any]:
    """The open in-process recovery's parts as rank 0's marks of the same restart come in (its catching up)."""
    recoveries = [dict(r) for r in status.get("recoveries") or []]
    if not recoveries or recoveries[-1]["level"] != "InProcess" or recoveries[-1].get("totalSeconds") is not None \
            or figures.get("inProcessFailedTime") is None or \
            abs(_failed_at(recoveries[-1]) - figures["inProcessFailedTime"]) > 0.05:
        return status
    recoveries[-1] = _in_process_parts(recoveries[-1], figures)
    return {**status, "recoveries": recoveries}


def _fill(status: dict[str, Any], figures: dict[str, Any]) -> dict[str, Any]:
    """The newest open recovery's start-up and catch-up parts, once a process that began after it reports."""
    recoveries = [dict(r) for r in status.get("recoveries") or []]
    if not recoveries or recoveries[-1].get("totalSeconds") is not None or recoveries[-1]["level"] == "InProcess":
        return status
    last = recoveries[-1]
    parts = dict(last["seconds"])
    detected = seconds_of(last["time"])
    if figures["processStartTime"] < detected or "stopping" not in parts:
        return status  # the old process still answers, or the old pods are not gone yet
    stopped = detected + parts["stopping"]
    marks = [("podStart", "processStartTime", stopped), ("rendezvous", "joinedTime", "processStartTime"),
             ("checkpointLoad", "firstStepTime", "joinedTime")]
    for part, end, begin_at in marks:
        start = figures.get(begin_at) if isinstance(begin_at, str) else begin_at
        if figures.get(end) is not None and start is not None:
            parts[part] = round(max(0.0, figures[end] - start), 2)
    if "loadedIteration" in figures:
        # The engine's own record (written at each logged step, beside the checkpoints) is exact where the
        # operator's reading is not: it saw the old process every few seconds, and an in-place restart only once
        # the new process answered, perhaps already past its checkpoint.
        if "priorHighWaterIteration" in figures:
            last["highWaterIteration"] = figures["priorHighWaterIteration"]
        last["fromIteration"] = figures["loadedIteration"]
        last["lostIterations"] = max(0, last["highWaterIteration"] - figures["loadedIteration"])
    if figures.get("caughtUpTime") and figures.get("firstStepTime"):
        parts["retrain"] = round(max(0.0, figures["caughtUpTime"] - figures["firstStepTime"]), 2)
        last["totalSeconds"] = round(figures["caughtUpTime"] - _failed_at(last), 2)
    last["seconds"] = parts
    return {**status, "recoveries": recoveries}


def _productive(goodput: dict[str, Any], figures: dict[str, Any]) -> dict[str, Any]:
    """The engine's productive seconds carry over restarts in a file beside the checkpoints; without one
    (no checkpoint.save) a new process counts from 0 and the operator adds what the earlier ones did."""
    reported = figures.get("productiveSeconds") or 0.0
    process = stamp(figures["processStartTime"])
    base = goodput.get("productiveBeforeSeconds", 0.0)
    if goodput.get("engineStartTime") not in (None, process) and \
            reported < goodput.get("productiveSeconds", 0.0) - base:
        base = goodput.get("productiveSeconds", 0.0)
    return {"engineStartTime": process, "productiveBeforeSeconds": base, "productiveSeconds": round(base + reported, 2)}


def _totals(status: dict[str, Any], goodput: dict[str, Any], at: float) -> dict[str, Any]:
    start = status.get("startTime")
    if not start:
        return goodput
    end = seconds_of(status["completionTime"]) if status.get("completionTime") else at
    wall = max(0.0, end - seconds_of(start))
    recovery = 0.0
    for r in status.get("recoveries") or []:
        recovery += r["totalSeconds"] if r.get("totalSeconds") is not None else max(0.0, end - _failed_at(r))
    productive = goodput.get("productiveSeconds", 0.0)
    return {**goodput, "wallSeconds": round(wall, 2), "recoverySeconds": round(recovery, 2),
            "productiveSeconds": round(productive, 2), "otherSeconds": round(wall - productive - recovery, 2),
            "goodput": round(productive / wall, 4) if wall > 0 else None}
