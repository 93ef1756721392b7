"""Experiment trackers (``train.observability.trackers``): MLflow, Weights & Biases, SwanLab.

Rank 0 opens one run per tracker after the checkpoint is loaded, logs the series the metrics endpoint serves (by
its status.progress names: ``loss``, ``learningRate``, ``tokensPerSecond``, ``mfu``, ``validationLoss``, the
stage's figures) at each logged iteration, and closes the runs at the end. The resolved engine config goes in as
the run's params / config, system info (host, device, world size, torch and megatron-core versions) as tags /
config, and ``ascend-engine evaluate`` adds its results to the same run (``evaluation.log_evaluation``).

A restarted or resumed job continues the same runs: their ids are kept in ``ascend_trackers.json`` beside the
checkpoints (``checkpoint.save``), keyed by the tracker's identity (type, server or project, experiment or
entity), and reused. Steps are the training iterations, so a restarted run's curve goes on where its checkpoint
was; iterations trained again after a restart are logged again at the same steps (see docs/metrics.md for what
each tracker shows then).

One small module per tracker (``mlflow_tracker``, ``wandb_tracker``, ``swanlab_tracker``), each a ``TrackerRun``;
a tracker's package is imported only when a job names it.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import socket
import sys
import tempfile
from typing import Any

from ...config.tracking import JOB_NAME_ENV, JOB_NAMESPACE_ENV, TRACKER_PACKAGES, TrackerConfig

RUNS_FILE = "ascend_trackers.json"
MODULES = {"mlflow": "mlflow_tracker", "wandb": "wandb_tracker", "swanlab": "swanlab_tracker"}


class TrackerError(RuntimeError):
    """A tracker the job names cannot be used (package missing, server refused the run): the run stops."""


class TrackerRun:
    """One tracker's run, opened by ``start``. Subclasses implement the four methods."""

    def __init__(self, cfg: TrackerConfig, default_dir: str | None):
        self.cfg = cfg
        self.dir = cfg.dir or (os.path.join(default_dir, cfg.type) if default_dir else None)

    def start(self, run_id: str | None, name: str, config: dict[str, Any], system: dict[str, Any]) -> dict[str, Any]:
        """Open (``run_id``: continue) the run; returns its record: ``runId``, and ``url`` / ``location`` where
        known."""
        raise NotImplementedError

    def log(self, metrics: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def log_evaluation(self, results: dict[str, float], step: int) -> None:
        """Evaluation results (``eval/<task>/<metric>``) at the evaluated checkpoint's iteration."""
        self.log(results, step)

    def close(self, status: str = "FINISHED") -> None:
        """``status``: FINISHED, FAILED or KILLED (stopped by SIGTERM, to be continued)."""
        raise NotImplementedError


def require_packages(trackers: list[TrackerConfig]) -> None:
    """Fail before anything heavy when a named tracker's package is not installed (no import: ``find_spec``)."""
    for t in trackers:
        package = TRACKER_PACKAGES[t.type]
        if importlib.util.find_spec(package) is None:
            raise TrackerError(f"observability.trackers names {t.type}, but the {package!r} package is not installed "
                               f"in this image (pip install {package})")


def make_run(cfg: TrackerConfig, default_dir: str | None) -> TrackerRun:
    module = importlib.import_module(f"{__name__}.{MODULES[cfg.type]}")
    return module.Run(cfg, default_dir)


def read_runs(directory: str | None) -> dict[str, dict[str, Any]]:
    """The saved runs by tracker key, or none (no directory, or no file yet)."""
    if not directory:
        return {}
    try:
        with open(os.path.join(directory, RUNS_FILE), encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return {}
    return {r["key"]: r for r in saved.get("runs", []) if isinstance(r, dict) and r.get("key") and r.get("runId")}


def write_runs(directory: str, runs: dict[str, dict[str, Any]]) -> None:
    """Atomically, as the checkpoint tracker file is: a crash never leaves half a file."""
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{RUNS_FILE}.")
    os.fchmod(fd, 0o644)  # as the checkpoints beside it (mkstemp makes it 0600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"runs": list(runs.values())}, f, indent=2)
    os.replace(tmp, os.path.join(directory, RUNS_FILE))


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"training": {"trainIters": 10}}`` -> ``{"training.trainIters": 10}`` (lists stay values)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def system_info(backend_name: str, world_size: int, layout: dict[str, int]) -> dict[str, Any]:
    """Where the run runs: host, device, world size and layout, and the versions that made it."""
    device, torch_version = backend_name, _version("torch")
    try:
        import torch

        torch_version = torch.__version__  # with its build (+cpu, +cu130), which the package metadata lacks
        if backend_name == "cuda" and torch.cuda.is_available():
            device = f"cuda ({torch.cuda.get_device_name(0)})"
        elif backend_name == "npu" and hasattr(torch, "npu"):
            device = f"npu ({torch.npu.get_device_name(0)})"
    except Exception:  # a device name is a nicety, never a reason to fail
        pass
    info = {"host": socket.gethostname(), "device": device, "worldSize": world_size,
            "nnodes": int(os.environ.get("NNODES", os.environ.get("PET_NNODES", "1"))), **layout,
            "python": sys.version.split()[0], "torch": torch_version, "megatronCore": _version("megatron-core"),
            "torchNpu": _version("torch_npu"), "ascendEngine": _version("ascend-train-operator"),
            "job": os.environ.get(JOB_NAME_ENV), "namespace": os.environ.get(JOB_NAMESPACE_ENV)}
    return {k: v for k, v in info.items() if v is not None}


def run_name(cfg: TrackerConfig) -> str:
    return cfg.runName or os.environ.get(JOB_NAME_ENV) or "ascend-engine-train"


class Trackers:
    """Rank 0's open runs. Logging never stops training: a tracker that fails mid-run is reported once on stderr
    and left out from then on (its run keeps what it had)."""

    def __init__(self, runs: list[TrackerRun], records: list[dict[str, Any]]):
        self.runs, self.records = runs, records
        self._failed: set[str] = set()

    def log(self, metrics: dict[str, Any], step: int) -> None:
        figures = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if not figures:
            return
        for run in self.runs:
            self._each(run, "log", lambda r: r.log(figures, step))

    def close(self, status: str = "FINISHED") -> None:
        for run in self.runs:
            self._each(run, "close", lambda r: r.close(status))
        self.runs = []

    def _each(self, run: TrackerRun, what: str, call) -> None:
        if run.cfg.type in self._failed:
            return
        try:
            call(run)
        except Exception as e:  # the tracker's own errors: network, server, quota
            self._failed.add(run.cfg.type)
            print(f"trackers: {run.cfg.type} failed to {what} ({type(e).__name__}: {e}); training goes on without "
                  "it", file=sys.stderr, flush=True)


def open_trackers(trackers: list[TrackerConfig], save_dir: str | None, config: dict[str, Any],
                  system: dict[str, Any]) -> Trackers:
    """Start (or continue, by the ids in ``save_dir``) one run per tracker; raises TrackerError when one cannot
    start. The ids are written back at once, so a crash before the first checkpoint still continues them."""
    require_packages(trackers)
    saved = read_runs(save_dir)
    runs, records = [], []
    for cfg in trackers:
        key = cfg.key()
        run = make_run(cfg, save_dir)
        previous = saved.get(key, {}).get("runId")
        try:
            record = run.start(previous, run_name(cfg), config, system)
        except Exception as e:
            Trackers(runs, records).close("FAILED")  # the ones already started end with this process
            if isinstance(e, TrackerError):
                raise
            raise TrackerError(f"observability.trackers: {cfg.type} could not start its run "
                               f"({type(e).__name__}: {e})") from e
        record = {"tracker": cfg.type, **record, "resumed": previous is not None and record["runId"] == previous}
        saved[key] = {"key": key, "tracker": cfg.type, "config": cfg.to_yaml_dict(),
                      **{k: v for k, v in record.items() if k != "resumed"}}
        if save_dir:  # at once: a later tracker failing to start, or a crash, still continues this run next time
            write_runs(save_dir, saved)
        runs.append(run)
        records.append(record)
        where = record.get("url") or record.get("location") or ""
        print(f"trackers: {cfg.type} run {record['runId']} {'continued' if record['resumed'] else 'started'}"
              f"{' at ' + where if where else ''}", flush=True)
    return Trackers(runs, records)


def status_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What goes in status.tracking: tracker, runId, url, location (no config, nothing secret)."""
    return [{k: r[k] for k in ("tracker", "runId", "url", "location") if r.get(k)} for r in records]
