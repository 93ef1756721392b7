"""Progress lines and rank-0 Prometheus metrics, shared by every engine command.

The operator reads these metrics from rank 0 on a timer and copies them into the resource's
``status.progress``; Prometheus can scrape the same endpoint. Metric names are the contract
(see ``METRIC_NAMES``); the operator's reader imports the same names.
"""
from __future__ import annotations

import atexit
import datetime as dt
import json
import os
import socket
import sys
import threading
import time
from typing import Any, TextIO
from urllib.parse import parse_qs

from .series import add_point

# Rank 0's start-up marks and recovery figures (train/goodput.py): the operator moves them from the scraped
# progress into status.recoveries and status.goodput. Times are unix seconds.
GOODPUT_METRICS = {f"ascend_goodput_{snake}": field for snake, field in (
    ("process_start_time", "processStartTime"), ("joined_time", "joinedTime"), ("built_time", "builtTime"),
    ("loaded_time", "loadedTime"), ("first_step_time", "firstStepTime"), ("caught_up_time", "caughtUpTime"),
    ("failed_time", "failedTime"), ("detected_time", "detectedTime"), ("stopped_time", "stoppedTime"),
    ("loaded_iteration", "loadedIteration"), ("prior_high_water_iteration", "priorHighWaterIteration"),
    ("productive_seconds", "productiveSeconds"),
    ("in_place_restarts", "inPlaceRestarts"),
    # the last in-process restart (ascend_engine.inprocess): its marks, as rank 0 saw them
    ("in_process_restarts", "inProcessRestarts"), ("in_process_failed_time", "inProcessFailedTime"),
    ("in_process_detected_time", "inProcessDetectedTime"), ("in_process_stopped_time", "inProcessStoppedTime"),
    ("in_process_rejoined_time", "inProcessRejoinedTime"), ("in_process_joined_time", "inProcessJoinedTime"),
    ("in_process_first_step_time", "inProcessFirstStepTime"),
    ("in_process_caught_up_time", "inProcessCaughtUpTime"),
    ("in_process_loaded_iteration", "inProcessLoadedIteration"),
    ("in_process_high_water_iteration", "inProcessHighWaterIteration"),
    ("in_process_spares", "inProcessSpares"), ("in_process_from_memory", "inProcessFromMemory"))}
# Metric name -> status.progress field. The operator imports this table, so the two never drift.
METRIC_NAMES = {
    **GOODPUT_METRICS,
    "ascend_progress_iteration": "iteration",
    "ascend_progress_total": "trainIters",
    "ascend_progress_percent": "percent",
    "ascend_train_loss": "loss",
    "ascend_validation_loss": "validationLoss",
    "ascend_train_load_balancing_loss": "loadBalancingLoss",
    "ascend_train_learning_rate": "learningRate",
    "ascend_train_tokens_per_second": "tokensPerSecond",
    "ascend_train_mfu": "mfu",
    "ascend_progress_eta_seconds": "etaSeconds",
    "ascend_checkpoint_last_iteration": "lastCheckpointIteration",
    "ascend_checkpoint_saving": "savingCheckpoint",
    "ascend_numerics_rollbacks": "numericRollbacks",
    "ascend_numerics_skipped_samples": "skippedSamples",
    "ascend_numerics_skipped_window_iteration": "skippedWindowIteration",
    "ascend_numerics_skipped_window_first_sample": "skippedWindowFirstSample",
    "ascend_numerics_skipped_window_end_sample": "skippedWindowEndSample",
    "ascend_train_rewards_chosen": "rewardsChosen",
    "ascend_train_rewards_rejected": "rewardsRejected",
    "ascend_train_reward_margin": "rewardMargin",
    "ascend_train_reward_accuracy": "rewardAccuracy",
    "ascend_train_step_accuracy": "stepAccuracy",
    "ascend_grpo_reward_mean": "rewardMean",
    "ascend_grpo_reward_std": "rewardStd",
    "ascend_grpo_accuracy": "accuracy",
    "ascend_grpo_reward_model_score": "rewardModelScore",
    "ascend_grpo_response_length": "responseLength",
    "ascend_grpo_kl": "kl",
    "ascend_grpo_clip_fraction": "clipFraction",
    "ascend_grpo_entropy": "entropy",
    "ascend_grpo_rollout_seconds": "rolloutSeconds",
    "ascend_grpo_update_seconds": "updateSeconds",
    "ascend_grpo_rollout_tokens_per_second": "rolloutTokensPerSecond",
    "ascend_grpo_update_tokens_per_second": "updateTokensPerSecond",
}
# The preference stages' log-line metrics (MindSpeed-LLM's names) -> status.progress fields.
PREFERENCE_METRICS = {"rewards/chosen": "rewardsChosen", "rewards/rejected": "rewardsRejected",
                      "rewards/margins": "rewardMargin", "rewards/accuracies": "rewardAccuracy"}
# The prm stage's log-line metric -> status.progress field.
PRM_METRICS = {"steps/accuracy": "stepAccuracy"}
# The grpo stage's log-line metrics -> status.progress fields.
GRPO_METRICS = {"grpo/reward_mean": "rewardMean", "grpo/reward_std": "rewardStd", "grpo/accuracy": "accuracy",
                "grpo/reward_model_score": "rewardModelScore",
                "grpo/response_length": "responseLength", "grpo/kl": "kl", "grpo/clip_fraction": "clipFraction",
                "grpo/entropy": "entropy", "timing/rollout_s": "rolloutSeconds", "timing/update_s": "updateSeconds",
                "tokens_per_s/rollout": "rolloutTokensPerSecond", "tokens_per_s/update": "updateTokensPerSecond"}


def preference_fields(metrics: dict[str, float]) -> dict[str, float]:
    """The status.progress fields among a step's metrics (none for pretrain / SFT; dpo / simpo / orm, prm and
    grpo's)."""
    return {field: metrics[name] for name, field in {**PREFERENCE_METRICS, **PRM_METRICS, **GRPO_METRICS}.items()
            if name in metrics}


SERIES_PATH = "/series"
EVENTS_PATH = "/events"
TRACKING_PATH = "/tracking"  # where the run is tracked (train/trackers): the operator's status.tracking
# At exit, how long rank 0 waits for its reader (the operator) to fetch the points it has not fetched yet.
SERIES_FLUSH_SECONDS = float(os.environ.get("ASCEND_SERIES_FLUSH_SECONDS", "20"))


class Metrics:
    """Gauges in a private registry, served over HTTP only where ``serve`` is called (rank 0), with the series
    of every logged point (``ascend_engine.series``) at ``/series`` as JSON.

    A gauge is registered on its first value: an unset one would read 0, and "loss 0 at iteration 0" is a lie
    the operator would copy into the status before training has reported anything."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry()
        self._gauges: dict[str, Any] = {}
        self.values: dict[str, float] = {}
        self.series: list[dict[str, Any]] = []
        self._fetched = threading.Condition()
        self._kept_iteration: int | None = None  # the newest point the reader has kept
        self._read = False  # a reader (the operator) has fetched the series, even while it was still empty
        self._reader_expected = False
        self.tracking: list[dict[str, Any]] = []  # the experiment trackers' runs (served at /tracking)

    def serve(self, port: int, addr: str | None = None) -> None:
        """Bind to ``addr`` or the pod's own IP (``POD_IP``), so jobs sharing a host never clash."""
        from wsgiref.simple_server import WSGIRequestHandler, make_server

        from prometheus_client import make_wsgi_app
        from prometheus_client.exposition import ThreadingWSGIServer

        metrics_app = make_wsgi_app(self.registry)

        def app(environ, start_response):
            path = environ.get("PATH_INFO")
            if path == SERIES_PATH:
                return self._serve_series(start_response, environ.get("QUERY_STRING", ""))
            if path == EVENTS_PATH:
                return _json_response(start_response, recent_events())
            if path == TRACKING_PATH:
                return _json_response(start_response, self.tracking)
            return metrics_app(environ, start_response)

        class Quiet(WSGIRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

        host = addr or os.environ.get("POD_IP") or "0.0.0.0"
        server_class = type("Server", (ThreadingWSGIServer,), {"address_family":
                                                               socket.AF_INET6 if ":" in host else socket.AF_INET})
        self.server = make_server(host, port, app, server_class, handler_class=Quiet)
        threading.Thread(target=self.server.serve_forever, name="metrics", daemon=True).start()
        # The endpoint dies with the process; the last figures outlive it as the termination message.
        atexit.register(lambda: _REPORTED or report_result(
            {**self.values, **({"tracking": self.tracking} if self.tracking else {})}))
        atexit.register(self._wait_for_reader)

    def _serve_series(self, start_response, query: str) -> _Sent:
        """The series as JSON. The reader says in ``?kept=N`` the newest iteration it has kept for good (the
        operator: in the job's history ConfigMap), so a run waiting at exit is released only once its newest point
        is kept, not merely read by a reader that may die before keeping it. A reader that does not say (an older
        operator) has kept what it read, once the response has been written (WSGI calls ``close`` after the last
        byte)."""
        with self._fetched:
            points = list(self.series)
        said = parse_qs(query).get("kept")
        kept = int(said[0]) if said and said[0].lstrip("-").isdigit() else None

        def sent() -> None:
            newest = kept if said else (points[-1]["iteration"] if points else None)
            with self._fetched:
                self._read = True
                if newest is not None and (self._kept_iteration is None or newest > self._kept_iteration):
                    self._kept_iteration = newest
                    self._fetched.notify_all()

        return _Sent(_json_response(start_response, points), sent)

    def _wait_for_reader(self) -> None:
        """Keep the endpoint up until the reader has kept the series' newest points (bounded), so the dashboard's
        history ends with the run's last logged iterations: also those of a run shorter than the operator's
        reading interval, or one that ended before the operator, slowed down, first read it (``expect_reader``)."""
        with self._fetched:
            if not (self._read or self._reader_expected) or not self.series:
                return  # nobody reads it (a run outside Kubernetes)
            self._fetched.wait_for(lambda: (self._kept_iteration or 0) >= self.series[-1]["iteration"],
                                   timeout=SERIES_FLUSH_SECONDS)

    def expect_reader(self) -> None:
        """A run that ended by itself in a pod the operator made (``POD_IP`` set, where it serves and the operator
        reads): wait at exit for the operator's read even if it has not read yet (not so on SIGTERM: the grace
        period is for saving)."""
        self._reader_expected = bool(os.environ.get("POD_IP"))

    def set(self, **fields: float) -> None:
        by_field = {f: n for n, f in METRIC_NAMES.items()}
        for field, value in fields.items():
            if value is not None:
                name = by_field[field]
                if name not in self._gauges:
                    from prometheus_client import Gauge

                    self._gauges[name] = Gauge(name, field, registry=self.registry)
                self._gauges[name].set(float(value))
                self.values[field] = value
        iteration = fields.get("iteration", self.values.get("iteration"))
        at = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        with self._fetched:
            self.series = add_point(self.series, iteration, fields, at) or self.series


def _json_response(start_response, served: Any) -> list[bytes]:
    body = json.dumps(served, separators=(",", ":")).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


class _Sent(list):
    """A WSGI body that calls ``on_sent`` from ``close``, which the server calls once it has written the body
    (or given up on a reader that went away)."""

    def __init__(self, body: list[bytes], on_sent) -> None:
        super().__init__(body)
        self._on_sent = on_sent

    def close(self) -> None:
        self._on_sent()


_SERVING: Metrics | None = None
_REPORTED = False

# Where Kubernetes takes a container's final message from (the pod's terminationMessagePath).
TERMINATION_LOG_ENV = "ASCEND_TERMINATION_LOG"
METRICS_PORT_ENV = "ASCEND_METRICS_PORT"


def serve_metrics(port: int, addr: str | None = None) -> Metrics:
    """Start this process's metrics endpoint once; ``Progress`` publishes into it from then on."""
    global _SERVING
    if _SERVING is None:
        _SERVING = Metrics()
        _SERVING.serve(port, addr)
    return _SERVING


def serving() -> Metrics | None:
    """This process's metrics endpoint, once ``serve_metrics`` started it."""
    return _SERVING


def serve_metrics_from_env() -> None:
    """One-pod jobs (preprocess, convert) get their port from the pod's environment."""
    port = os.environ.get(METRICS_PORT_ENV)
    if port:
        serve_metrics(int(port))


def report_result(result: dict[str, Any]) -> None:
    """Leave the command's final figures where the operator reads them: the container's termination message
    (Kubernetes caps it at 4 KiB, so keep it to counts and paths)."""
    global _REPORTED
    _REPORTED = True
    path = os.environ.get(TERMINATION_LOG_ENV)
    if path:
        with open(path, "w") as f:
            json.dump(result, f, separators=(",", ":"), default=str)


def report_failure(reason: str, message: str, extra: dict[str, Any] | None = None) -> None:
    """The error that ends the command, as its termination message (the operator puts it in the job's
    conditions); a report written before (a command's own failure summary) stays. ``extra``: more fields.

    Under torchrun its one line also goes to the worker's error file, where the agent reads it: the launcher's
    record and report of in-place restarts name it (``inplace.record_worker_error``)."""
    from .inplace import error_line, record_worker_error

    record_worker_error(error_line(reason, message))
    if not _REPORTED:
        report_result({"status": "Failed", "reason": reason, "message": message[-2000:], **(extra or {})})


HEARTBEAT_S = 3.0  # a start-up step that lasts longer is said again: with a busy machine's delays, never 5 s of silence


class _StartUp:
    """The start-up step said last, repeated (``still importing torch (8s)``) every ``HEARTBEAT_S`` while it lasts:
    importing torch and Megatron-core takes tens of seconds on a busy machine, with nothing of their own to say.
    A daemon thread that wakes a few times a second; it neither slows the step nor writes anything but stderr."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._step: tuple[str, str, float, float, float] | None = None  # command, what, started, began, last said
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def said(self, command: str, what: str, started: float) -> None:
        now = time.perf_counter()
        with self._lock:
            self._step = (command, what, started, now, now)
            if self._thread is None and not self._done.is_set():
                self._thread = threading.Thread(target=self._beat, name="start-up heartbeat", daemon=True)
                self._thread.start()

    def finished(self) -> None:
        self._done.set()

    def _beat(self) -> None:
        while not self._done.wait(min(0.5, HEARTBEAT_S / 4)):
            with self._lock:
                command, what, started, began, last = self._step
                now = time.perf_counter()
                if now - last < HEARTBEAT_S:
                    continue
                self._step = (command, what, started, began, now)
            print(f"[{command}] {now - started:5.1f}s still {what} ({now - began:.0f}s)", file=sys.stderr, flush=True)


_START_UP = _StartUp()


def say(command: str, what: str, started: float) -> None:
    """A start-up line from global rank 0 (stderr, like the other progress lines), so a pod's log says what the
    command is doing during the tens of seconds before its first result: ``[train]  19.1s building the model``;
    said again every few seconds while the step lasts, until ``started_up()``."""
    if os.environ.get("RANK", "0") == "0":
        print(f"[{command}] {time.perf_counter() - started:5.1f}s {what}", file=sys.stderr, flush=True)
        _START_UP.said(command, what, started)


def started_up() -> None:
    """The command has begun its own work and reports its progress itself: no more start-up lines."""
    _START_UP.finished()


def fail(command: str, message: str, reason: str, exit_code: int = 2, extra: dict[str, Any] | None = None) -> int:
    """End a command with a known error: its one line on stderr and, on every rank, in the termination message
    (the job's Failed condition quotes it; torchrun's traceback summary never reaches either)."""
    print(f"ascend-engine {command}: {message}", file=sys.stderr, flush=True)
    report_failure(reason, message, extra)
    return exit_code


# A notice for the job's Kubernetes events (engine -> operator, like the metric names above): a line in the
# process's log (the prefix, then one JSON object with "type" (Normal / Warning), "reason", "message") and, on the
# rank that serves metrics, an entry of ``/events``, which the operator reads and posts once per "id" (it cannot
# read pods' logs cheaply on a real cluster).
EVENT_PREFIX = "ascend-event: "
MAX_EVENTS = 64  # the newest ones kept for /events; the operator reads them every few seconds
_EVENTS: list[dict[str, Any]] = []
_EVENTS_LOCK = threading.Lock()
# Ids are unique across processes (a restarted pod numbers its events from 1 again): this process's tag, then a count.
_PROCESS_TAG = os.urandom(4).hex()


def emit_event(event_type: str, reason: str, message: str) -> None:
    """Recorded before the metrics endpoint exists too (a checkpoint fallback happens while loading, before it
    serves): ``/events`` lists every event this process kept."""
    event = {"type": event_type, "reason": reason, "message": message[-1000:]}
    with _EVENTS_LOCK:
        seq = (_EVENTS[-1]["seq"] + 1) if _EVENTS else 1
        _EVENTS.append({**event, "seq": seq, "id": f"{_PROCESS_TAG}-{seq}",
                        "time": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")})
        del _EVENTS[:-MAX_EVENTS]
    print(EVENT_PREFIX + json.dumps(event), file=sys.stderr, flush=True)


def recent_events() -> list[dict[str, Any]]:
    """The newest events of this process, oldest first (``/events``)."""
    with _EVENTS_LOCK:
        return list(_EVENTS)


def format_seconds(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """A periodic line with done/total, rate and ETA, and a one-line summary at the end."""

    def __init__(self, what: str, total: int | None = None, unit: str = "items", interval_s: float = 5.0,
                 stream: TextIO | None = None, enabled: bool = True, already_done: int = 0):
        """``already_done``: work finished before this process started (a resumed run's iterations); it counts
        towards done/total but not towards the rate, which is this process's own."""
        self.what, self.total, self.unit = what, total, unit
        self.interval_s, self.stream, self.enabled = interval_s, stream or sys.stderr, enabled
        self.done = self.already_done = already_done
        self.start = self._last = time.monotonic()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def rate(self) -> float:
        return (self.done - self.already_done) / self.elapsed if self.elapsed > 0 else 0.0

    def eta(self) -> float | None:
        if not self.total or self.done <= self.already_done:
            return None
        return (self.total - self.done) / max(self.rate(), 1e-12)

    def update(self, n: int = 1, extra: str = "") -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and now - self._last >= self.interval_s:
            self._last = now
            self.stream.write(self.line(extra) + "\n")
            self.stream.flush()
        if _SERVING is not None:
            _SERVING.set(iteration=self.done, trainIters=self.total, etaSeconds=self.eta(),
                         percent=100.0 * self.done / self.total if self.total else None)

    def line(self, extra: str = "") -> str:
        total = f"/{self.total}" if self.total else ""
        pct = f" ({100.0 * self.done / self.total:.1f}%)" if self.total else ""
        eta = self.eta()
        eta_s = f", ETA {format_seconds(eta)}" if eta is not None else ""
        tail = f", {extra}" if extra else ""
        return f"[{self.what}] {self.done}{total} {self.unit}{pct}, {self.rate():.1f} {self.unit}/s{eta_s}{tail}"

    def summary(self, text: str) -> None:
        if self.enabled:
            self.stream.write(f"[{self.what}] done in {self.elapsed:.1f}s: {text}\n")
            self.stream.flush()
