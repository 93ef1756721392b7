"""What the reporting pods of a job's current attempt say while they run (their metrics endpoint) and once they
ended (their final report): status.progress, the points for the history, rank 0's notices, status.tracking."""
from __future__ import annotations

from typing import Any

from ..cache.job_pods import JobPods
from ..lifecycle import attempts
from ..lifecycle.kinds import JobKind
from ..lifecycle.status import now, termination_result
from .scrape import scrape, scrape_events, scrape_series, scrape_tracking


def reporters(job: JobKind, spec: Any, pods: JobPods, name: str, attempt: int) -> list[dict[str, Any]]:
    """The pods of ``attempt`` whose metrics and final report make the job's progress (rank 0; a trainer's first
    and last), live or ending."""
    found = (pods.get(attempts.pod_name(name, i, attempt)) for i in dict.fromkeys(job.reporting_pods(spec)))
    return [p for p in found if p is not None]


def live_progress(job: JobKind, spec: Any, reporters_: list[dict[str, Any]],
                  kept: int) -> tuple[dict[str, Any] | None, list | None, list[dict]]:
    """The reporting pods' figures for status.progress (later pods win), the series of logged points for the
    history (from the first pod that serves one: rank 0 of an engine job; ``kept``: the newest iteration the
    history holds), and that pod's recent events."""
    port = job.metrics_port(spec)
    progress: dict[str, Any] = {}
    series = None
    events: list[dict] = []
    for pod in reporters_:
        ip = pod.get("status", {}).get("podIP")
        if not port or not ip or pod["status"].get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
            continue
        figures = scrape(f"http://{ip}:{port}/metrics")
        if not figures:
            continue
        progress.update({job.progress_fields[k]: v for k, v in figures.items() if k in job.progress_fields})
        if series is None:
            series = scrape_series(f"http://{ip}:{port}", kept)
            events = scrape_events(f"http://{ip}:{port}")
    return ({**progress, "lastUpdateTime": now()}, series, events) if progress else (None, None, events)


def tracking(job: JobKind, spec: Any, status: dict[str, Any], reporters_: list[dict[str, Any]]) -> list[dict] | None:
    """status.tracking from rank 0 (``/tracking``) while the job names trackers that the status does not show yet
    (once there, a run's ids stay the same across restarts: no more reads)."""
    train = getattr(spec, "train", None)
    wanted = len(train.observability.trackers) if train else 0
    port = job.metrics_port(spec)
    if not wanted or len(status.get("tracking") or []) >= wanted or not port:
        return None
    for pod in reporters_[:1]:
        ip = pod.get("status", {}).get("podIP")
        if ip and pod["status"].get("phase") == "Running":
            return scrape_tracking(f"http://{ip}:{port}") or None
    return None


def final_report(reporters_: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The reporting pods' final reports merged (later pods win), or None."""
    return {k: v for pod in reporters_ for k, v in (termination_result(pod) or {}).items()} or None


def stopped_at_checkpoint(reporters_: list[dict[str, Any]]) -> int | None:
    """The iteration whose checkpoint the stopped gang saved on its way out (the engine's Preempted report: SIGTERM
    on suspension or eviction makes it save the step in flight), or None."""
    for pod in reporters_:
        report = termination_result(pod) or {}
        if report.get("reason") == "Preempted" and report.get("checkpoint") and \
                isinstance(report.get("iteration"), int):
            return report["iteration"]
    return None
