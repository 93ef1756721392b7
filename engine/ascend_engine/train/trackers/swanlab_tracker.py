"""SwanLab: a run continued by its id (``resume="allow"``), in cloud (online), offline or local mode.

The API key comes from ``SWANLAB_API_KEY`` (the tracker's Secret); a private deployment's address from
``SWANLAB_HOST`` in the same Secret. SwanLab makes the run's id itself (21 characters) the first time; it is kept
beside the checkpoints and passed back on a restart. Steps are the training iterations.
"""
from __future__ import annotations

from typing import Any

from . import TrackerRun
from ...config.tracking import DEFAULT_PROJECT

MODES = {"online": "cloud", "offline": "offline", "local": "local"}  # swanlab before 0.7 says cloud for online


class Run(TrackerRun):
    def start(self, run_id: str | None, name: str, config: dict[str, Any], system: dict[str, Any]) -> dict[str, Any]:
        import inspect

        import swanlab

        # swanlab 0.10 names its arguments name / log_dir and its mode online; older ones experiment_name / logdir
        # and cloud
        current = "log_dir" in inspect.signature(swanlab.init).parameters
        kwargs: dict[str, Any] = {"project": self.cfg.project or DEFAULT_PROJECT, "workspace": self.cfg.entity,
                                  "name" if current else "experiment_name": name,
                                  "mode": self.cfg.mode if current else MODES[self.cfg.mode],
                                  "log_dir" if current else "logdir": self.dir}
        if config or system:
            kwargs["config"] = {**config, "system": system}
        if run_id:
            kwargs.update(id=run_id, resume="allow")
        self.run = swanlab.init(**{k: v for k, v in kwargs.items() if v is not None})
        public = getattr(self.run, "public", None)  # swanlab 0.6: run.public.run_id, run.public.cloud
        record: dict[str, Any] = {"runId": getattr(self.run, "id", None) or getattr(public, "run_id", None) or run_id}
        if self.cfg.mode == "online":  # offline and local runs have no URL (swanlab 0.10 raises on run.url)
            url = getattr(self.run, "url", None) or getattr(getattr(public, "cloud", None), "experiment_url", None)
            if url:
                record["url"] = url
        if "url" not in record and self.dir:
            record["location"] = self.dir
        if not record["runId"]:
            raise RuntimeError("swanlab did not say the run's id (swanlab 0.6 or newer is needed to continue runs)")
        return record

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self, status: str = "FINISHED") -> None:
        if status == "FINISHED":
            self.run.finish()
            return
        try:
            self.run.finish(state="crashed", error=f"the training process ended: {status}")
        except TypeError:  # an older swanlab without the state argument
            self.run.finish()
