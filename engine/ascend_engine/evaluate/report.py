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


# The metric an lm-eval task's ``accuracy`` shows: the first of these it reports (with any filter); a task with
# none of them (a perplexity) has no accuracy, and its summary shows its first metric.
ACCURACY_METRICS = ("acc", "exact_match", "acc_norm", "pass@1", "f1", "mcc")


def _leaves(results: dict, name: str) -> list[str]:
    """The tasks under ``name`` (itself if a task): lm-eval's groups nest (mmlu > mmlu_stem > mmlu_physics)."""
    members = results.get("group_subtasks", {}).get(name)
    return [leaf for m in members for leaf in _leaves(results, m)] if members else [name]


def lm_eval_summary(results: dict, names: list[str], checkpoint: str, seconds: float) -> dict:
    """``status.evaluation`` of an lm-eval run: per requested task or group, lm-eval's metric values (keys as in
    lm-eval's results, metric and filter: ``acc,none``; no standard errors), the metric ``accuracy`` holds and
    the documents scored."""
    tasks = []
    counts = results.get("n-samples", {})
    for name in names:
        block = results.get("results", {}).get(name) or results.get("groups", {}).get(name) or {}
        metrics = {k: round(float(v), 6) for k, v in block.items()
                   if "," in k and "_stderr," not in k and isinstance(v, (int, float)) and not isinstance(v, bool)}
        primary = next((k for m in ACCURACY_METRICS for k in metrics if k.split(",")[0] == m), None)
        samples = sum(int(counts.get(t, {}).get("effective", 0)) for t in _leaves(results, name))
        # no accuracy for a perplexity, no seconds (lm-eval batches every task's requests together): left out
        entry = {"task": name, "accuracy": metrics[primary] if primary else None,
                 "metric": primary or next(iter(metrics), None), "metrics": metrics, "samples": samples}
        tasks.append({k: v for k, v in entry.items() if v is not None})

    def short(t: dict) -> str:
        if t.get("accuracy") is not None:
            return f"{t['task']}={t['accuracy']:.4f}"
        if t.get("metric"):
            return f"{t['task']}:{t['metric'].split(',')[0]}={t['metrics'][t['metric']]:.4g}"
        return f"{t['task']}=-"

    return {
        "summary": " ".join(map(short, tasks)),
        "tasks": tasks,
        "checkpoint": checkpoint,
        "backend": "lm-eval",
        "seconds": round(seconds, 3),
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
    from ..train.trackers.evaluation import log_evaluation

    log_evaluation(summary.get("checkpoint"), summary)  # into the training's tracker runs, where it has some
