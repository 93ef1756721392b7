"""Per-task results: accuracy overall and per subject, a printed table, a JSON file, the termination message."""
from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from .scoring import Outcome


def task_result(task: str, outcomes: list[Outcome], seconds: float) -> dict:
    by_subject: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        by_subject[o.subject].append(o)
    correct = sum(o.correct for o in outcomes)
    return {
        "task": task,
        "accuracy": correct / len(outcomes) if outcomes else 0.0,
        "correct": correct,
        "samples": len(outcomes),
        "seconds": round(seconds, 3),
        "questionsPerSecond": round(len(outcomes) / seconds, 3) if seconds > 0 else None,
        "subjects": {s: {"accuracy": sum(o.correct for o in os_) / len(os_), "correct": sum(o.correct for o in os_),
                         "samples": len(os_)} for s, os_ in sorted(by_subject.items())},
        "predictions": [asdict(o) for o in outcomes],
    }


def format_table(results: list[dict]) -> str:
    """A plain table: one line per subject, then the task's total."""
    lines = [f"{'task':<12} {'subject':<40} {'samples':>8} {'accuracy':>9}"]
    for r in results:
        for subject, s in r["subjects"].items():
            if len(r["subjects"]) > 1:
                lines.append(f"{r['task']:<12} {subject[:40]:<40} {s['samples']:>8} {s['accuracy']:>9.4f}")
        lines.append(f"{r['task']:<12} {'(all)':<40} {r['samples']:>8} {r['accuracy']:>9.4f}"
                     f"   {r['seconds']:.1f}s")
    return "\n".join(lines)


def write_json(path: Path, document: dict) -> None:
    """Atomically: a crash never leaves a half-written report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(document, f, indent=2, ensure_ascii=False)
    os.replace(tmp, path)


def status_summary(results: list[dict], checkpoint: str) -> dict:
    """What ``status.evaluation`` shows (small: the termination message is capped at 4 KiB)."""
    return {
        "summary": " ".join(f"{r['task']}={r['accuracy']:.4f}" for r in results),
        "tasks": [{"task": r["task"], "accuracy": round(r["accuracy"], 6), "samples": r["samples"],
                   "seconds": r["seconds"]} for r in results],
        "checkpoint": checkpoint,
        "finishedAt": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def report_to_termination_message(summary: dict) -> None:
    """Add ``evaluation`` to the container's termination message, keeping what an earlier command (training in
    the same pod) left there."""
    from ..telemetry import TERMINATION_LOG_ENV, report_result

    path = os.environ.get(TERMINATION_LOG_ENV)
    previous: dict = {}
    if path and os.path.isfile(path):
        try:
            loaded = json.loads(Path(path).read_text() or "{}")
            previous = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            previous = {}
    report_result({**previous, "evaluation": summary})
