"""MLflow: a run in ``experiment`` on ``trackingUri``; params are the flattened config, tags the system info.

Credentials come from the environment the client reads (``MLFLOW_TRACKING_TOKEN``, or
``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``), which the operator fills from the tracker's Secret.
Metrics are sent in the background (MLflow's asynchronous logging), so a slow server never slows a step; ``close``
waits for them. MLflow params cannot change: a continued run keeps the values it started with, and a value that
differs now (a longer trainIters) goes in a tag ``config.<name>``.
"""
from __future__ import annotations

import time
from typing import Any

from . import TrackerRun, flatten

MAX_PARAM = 6000  # MLflow's limit on a param value's length
DEFAULT_EXPERIMENT = "ascend-train"


class Run(TrackerRun):
    def start(self, run_id: str | None, name: str, config: dict[str, Any], system: dict[str, Any]) -> dict[str, Any]:
        from mlflow import MlflowClient
        from mlflow.entities import Param, RunTag
        from mlflow.exceptions import MlflowException

        self.client = MlflowClient(tracking_uri=self.cfg.trackingUri)
        run = None
        if run_id:
            try:
                run = self.client.get_run(run_id)
            except MlflowException:  # deleted, or another server: start a new one
                run = None
        if run is None or run.info.lifecycle_stage == "deleted":
            experiment = self.cfg.experiment or DEFAULT_EXPERIMENT
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
            run = self.client.create_run(experiment_id, run_name=name)
        else:
            self.client.update_run(run.info.run_id, status="RUNNING")
        self.run_id, self.experiment_id = run.info.run_id, run.info.experiment_id
        self.pending: list = []  # metrics sent in the background, waited for by close
        had = run.data.params
        params, tags = [], [RunTag(f"system.{k}", str(v)) for k, v in system.items()]
        for key, value in flatten(config).items():
            text = str(value)[:MAX_PARAM]
            if key not in had:
                params.append(Param(key, text))
            elif had[key] != text:
                tags.append(RunTag(f"config.{key}", text))
        for i in range(0, max(len(params), len(tags)), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100], tags=tags[i:i + 100])
        return {"runId": self.run_id, "experimentId": self.experiment_id, **self._where()}

    def _where(self) -> dict[str, str]:
        uri = self.cfg.trackingUri.rstrip("/")
        if uri.startswith(("http://", "https://")):
            return {"url": f"{uri}/#/experiments/{self.experiment_id}/runs/{self.run_id}"}
        return {"location": uri}

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        still = []
        for operation in self.pending:  # the batches sent before: a refused one raises here (said once, dropped)
            if all(f.done() for f in getattr(operation, "_operation_futures", ())):
                operation.wait()
            else:
                still.append(operation)
        self.pending = still + [self.client.log_batch(
            self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()], synchronous=False)]

    def close(self, status: str = "FINISHED") -> None:
        # the client's own operations, not mlflow.flush_async_logging(): that one opens the default tracking
        # store (an mlflow.db in the working directory) as a side effect
        for operation in self.pending:
            operation.wait()
        self.pending = []
        self.client.set_terminated(self.run_id, status)
