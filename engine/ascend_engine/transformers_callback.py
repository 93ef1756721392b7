"""Live progress for HuggingFace Transformers' ``Trainer`` under the operator: one callback, no other change.

    from ascend_engine.transformers_callback import AscendProgressCallback
    trainer = Trainer(model=..., args=..., callbacks=[AscendProgressCallback()])

The world's process 0 serves the engine's metrics (``ascend_engine.telemetry.METRIC_NAMES``) on
``ASCEND_METRICS_PORT`` (the operator sets it in a job with ``spec.trainer``; use ``trainer.progress: none`` so no
log reader is wrapped around the command) and leaves the last figures as the container's termination message,
so status.progress, the columns, the dashboard and Prometheus work as for an engine job. Tokens per second need
``TrainingArguments(include_num_input_tokens_seen=True)``.
"""
from __future__ import annotations

import os
import time

from transformers import TrainerCallback

from .telemetry import METRICS_PORT_ENV, Metrics, report_result, serve_metrics


class AscendProgressCallback(TrainerCallback):
    def __init__(self, port: int | None = None):
        """``port``: where to serve (default ``$ASCEND_METRICS_PORT``; without either nothing is served, and the
        figures are still kept in ``values``)."""
        self.port = port if port is not None else int(os.environ[METRICS_PORT_ENV]) \
            if os.environ.get(METRICS_PORT_ENV) else None
        self.metrics: Metrics | None = None
        self.values: dict[str, float] = {}
        self._tokens_at: tuple[float, int] | None = None
        self._started: tuple[float, int] | None = None

    def _set(self, state, **fields) -> None:
        if not state.is_world_process_zero:
            return
        fields = {k: v for k, v in fields.items() if v is not None}
        self.values.update(fields)
        if self.metrics is not None:
            self.metrics.set(**fields)

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.port and self.metrics is None:
            self.metrics = serve_metrics(self.port)
        self._started = (time.monotonic(), state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        step, total = state.global_step, state.max_steps or None
        eta = None
        if self._started and total and step > self._started[1]:
            rate = (step - self._started[1]) / max(time.monotonic() - self._started[0], 1e-9)
            eta = (total - step) / rate
        self._set(state, iteration=step, trainIters=total, percent=100.0 * step / total if total else None,
                  etaSeconds=eta)

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        tokens = None
        seen = getattr(state, "num_input_tokens_seen", 0) or 0
        now = time.monotonic()
        if seen and self._tokens_at and now > self._tokens_at[0] and seen > self._tokens_at[1]:
            tokens = (seen - self._tokens_at[1]) / (now - self._tokens_at[0])
        if seen:
            self._tokens_at = (now, seen)
        self._set(state, loss=logs.get("loss"), learningRate=logs.get("learning_rate"),
                  validationLoss=logs.get("eval_loss"), tokensPerSecond=tokens)

    def on_save(self, args, state, control, **kwargs):
        self._set(state, lastCheckpointIteration=state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.values:
            report_result(dict(self.values))
