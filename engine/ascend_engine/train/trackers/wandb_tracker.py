"""Weights & Biases: a run with a fixed id (``resume="allow"``), online or offline.

The API key comes from ``WANDB_API_KEY`` (the tracker's Secret). Each point carries ``iteration`` and every
figure is plotted against it (``define_metric``), so a continued run's curve goes on at its checkpoint's
iteration. Offline, each process writes its own folder under ``<dir>/wandb/offline-run-<time>-<id>``; ``wandb
sync <dir>/wandb/offline-run-*`` uploads them in order into the one run.
"""
from __future__ import annotations

import os
import secrets
import string
from typing import Any

from . import TrackerRun
from ...config.tracking import DEFAULT_PROJECT


def new_id() -> str:
    """W&B run ids: lowercase letters and digits (what ``wandb.util.generate_id`` makes)."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


class Run(TrackerRun):
    def start(self, run_id: str | None, name: str, config: dict[str, Any], system: dict[str, Any]) -> dict[str, Any]:
        import wandb

        if self.dir:
            os.makedirs(self.dir, exist_ok=True)
        self.run = wandb.init(project=self.cfg.project or DEFAULT_PROJECT, entity=self.cfg.entity, name=name,
                              id=run_id or new_id(), resume="allow", mode=self.cfg.mode, dir=self.dir,
                              # the pod's log keeps stdout; W&B need not capture it again
                              settings=wandb.Settings(console="off", silent=True))
        self.run.define_metric("iteration")
        self.run.define_metric("*", step_metric="iteration")
        if config or system:
            self.run.config.update({**config, "system": system}, allow_val_change=True)
        record: dict[str, Any] = {"runId": self.run.id}
        if self.run.url:
            record["url"] = self.run.url
        sync_dir = getattr(self.run.settings, "sync_dir", None)
        if self.cfg.mode == "offline" and sync_dir:
            record["location"] = str(sync_dir)
        return record

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log({**metrics, "iteration": step})

    def log_evaluation(self, results: dict[str, float], step: int) -> None:
        self.run.log({**results, "iteration": step})
        self.run.summary.update(results)

    def close(self, status: str = "FINISHED") -> None:
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)
