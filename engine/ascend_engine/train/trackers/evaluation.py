"""An evaluation's results in the training runs of the checkpoint it evaluated (rank 0 of ``ascend-engine
evaluate``): each figure as ``eval/<task>/<metric>`` at the checkpoint's iteration."""
from __future__ import annotations

import re
import sys
from typing import Any

from ...checkpoint.layout import read_latest
from ...config.tracking import TrackerConfig
from . import flatten, make_run, read_runs, run_name


def metric_name(text: str) -> str:
    """A name every tracker takes (MLflow allows letters, digits, ``_ - . /`` and spaces): lm-eval's
    ``acc,none`` becomes ``acc``, ``exact_match,strict-match`` becomes ``exact_match/strict-match``."""
    text = text.replace(",none", "").replace(",", "/")
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", text)


def evaluation_figures(summary: dict[str, Any]) -> dict[str, float]:
    """``eval/<task>/<metric>`` for every number of each task in an evaluation summary (``accuracy``,
    ``samples``, ``seconds``, and lm-eval's ``metrics``)."""
    out: dict[str, float] = {}
    for task in summary.get("tasks") or []:
        name = task.get("task") or task.get("name")
        for metric, value in flatten({k: v for k, v in task.items() if k not in ("task", "name")}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                metric = metric[len("metrics."):] if metric.startswith("metrics.") else metric
                out[metric_name(f"eval/{name}/{metric}")] = float(value)
    return out


def log_evaluation(load_dir: str | None, summary: dict[str, Any]) -> None:
    """Add an evaluation's results to the training runs recorded beside the checkpoint it evaluated (rank 0 of
    ``ascend-engine evaluate``). Nothing when that directory has no tracker runs; a tracker that fails is said
    on stderr, never fails the evaluation."""
    saved = read_runs(load_dir)
    figures = evaluation_figures(summary)
    if not saved or not figures:
        return
    step = _checkpoint_iteration(load_dir)
    for record in saved.values():
        try:
            cfg = TrackerConfig.model_validate(record["config"])
            run = make_run(cfg, load_dir)
            run.start(record["runId"], run_name(cfg), {}, {})
            run.log_evaluation(figures, step)
            run.close()
            print(f"trackers: evaluation results logged to {cfg.type} run {record['runId']}", file=sys.stderr,
                  flush=True)
        except Exception as e:
            print(f"trackers: could not log the evaluation to {record.get('tracker')} run {record.get('runId')} "
                  f"({type(e).__name__}: {e})", file=sys.stderr, flush=True)


def _checkpoint_iteration(load_dir: str | None) -> int:
    """The evaluated checkpoint's iteration; 0 for a release checkpoint or none."""
    try:
        latest = read_latest(load_dir) if load_dir else None
    except ValueError:
        return 0
    return latest if isinstance(latest, int) else 0
