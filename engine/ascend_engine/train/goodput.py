"""What a recovery cost and what the run has trained, measured by the engine (rank 0 serves the figures).

Start-up marks of this process (wall-clock seconds): the process began, joined the process group, built the
model, loaded the checkpoint, began the first step, and caught up (finished the highest iteration any earlier
process of the run reached: until then it trains steps again). With them come, gathered from every pod once
after joining, the in-place restart records of the pods' torchrun agents (``ascend_engine.inplace``).

The run's high-water iteration and its productive seconds (loop time spent on iterations past the high-water
mark) outlive the process in a small file beside the checkpoints (``checkpoint.save``), written by rank 0 at each
logged step, so the next process knows which steps are trained again and the total keeps growing across
restarts. The operator turns the marks into each recovery's parts and the job's goodput
(``operator/ascend_operator/recovery/goodput.py``).
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

from ..inplace import read_record

PROGRESS_FILE = "ascend_goodput.json"


def process_start() -> float:
    """When this process began (the kernel's record), so interpreter and torch start-up count."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat", encoding="ascii") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration):
        return time.time()


def gather_objects(mine: Any) -> list[Any]:
    """``mine`` from every rank of the world, in rank order (a collective)."""
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine)
    return out


class GoodputClock:
    """Rank 0's marks and counters; ``figures`` are the gauges the operator reads."""

    def __init__(self, save_dir: str | None):
        self.path = os.path.join(save_dir, PROGRESS_FILE) if save_dir else None
        saved = self._read()
        self.high_water = int(saved.get("highWaterIteration", 0))
        self.prior_high_water = self.high_water  # what earlier processes reached: steps below it are trained again
        self.productive_before = float(saved.get("productiveSeconds", 0.0))
        self.productive = 0.0
        self.marks: dict[str, float] = {"processStart": process_start()}
        self.agents: list[dict[str, Any]] = []
        self.loaded_iteration = 0
        self._last_step_end: float | None = None

    def _read(self) -> dict[str, Any]:
        try:
            with open(self.path or "", encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def mark(self, name: str) -> None:
        self.marks.setdefault(name, time.time())

    def gather_agents(self, gather) -> None:
        """Every pod's agent record (local rank 0 of each pod reads it), via ``gather`` (all_gather_object)."""
        mine = read_record() if os.environ.get("LOCAL_RANK", "0") == "0" else None
        self.agents = [r for r in gather(mine) if r]

    def step_done(self, iteration: int) -> None:
        """After each step: time past the high-water mark is productive; reaching it ends the catch-up."""
        now = time.time()
        start = self._last_step_end or self.marks.get("firstStep", now)
        self._last_step_end = now
        if iteration > self.high_water:
            if "caughtUp" not in self.marks:
                self.marks["caughtUp"] = start
            self.productive += now - start
            self.high_water = iteration

    def save(self) -> None:
        """Rank 0 at a logged step: the high-water mark and productive seconds for the next process."""
        if not self.path:
            return
        tmp = f"{self.path}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"highWaterIteration": self.high_water,
                           "productiveSeconds": self.productive_before + self.productive}, f)
            os.replace(tmp, self.path)
        except OSError as e:  # the figures are worth less than the step: say it once and go on
            if self.path:
                print(f"goodput: cannot write {self.path}: {e}; the next process counts its steps from zero",
                      flush=True)
            self.path = None

    @property
    def in_place_restarts(self) -> int:
        """Restarts the pods' agents made (each pod's agent restarts once per round: the largest count)."""
        return max((r.get("restarts", 0) for r in self.agents), default=0)

    def figures(self) -> dict[str, float]:
        """Gauges (``telemetry.GOODPUT_METRICS``): marks as unix seconds, counts, the run's productive seconds."""
        out = {f"{name}Time": at for name, at in self.marks.items()}
        out["loadedIteration"] = self.loaded_iteration
        if self.path:  # the record beside the checkpoints: what the earlier processes reached, exactly
            out["priorHighWaterIteration"] = self.prior_high_water
        out["productiveSeconds"] = self.productive_before + self.productive
        last = [r.get("last") or {} for r in self.agents]
        if restarts := self.in_place_restarts:
            out["inPlaceRestarts"] = restarts
            failed = [f["failedAt"] for r in last for f in r.get("failures", [])]
            for name, values in (("failed", failed), ("detected", [r["detectedAt"] for r in last if "detectedAt" in r]),
                                 ("stopped", [r["stoppedAt"] for r in last if "stoppedAt" in r])):
                if values:
                    out[f"{name}Time"] = (max if name == "stopped" else min)(values)
        return out

    def restart_summary(self) -> str | None:
        """The event's words for an in-place restart seen by this process, or None."""
        restarts = self.in_place_restarts
        if not restarts:
            return None
        seen = sorted(((f, r.get("podIndex", "?")) for r in self.agents for f in (r.get("last") or {}).get("failures", [])),
                      key=lambda item: (item[0]["failedAt"], not item[0].get("signal")))  # the first, a kill first
        failures = [f"pod index {pod} local rank {f['localRank']} " +
                    (f"killed by {f['signal']}" if f.get("signal") else f"exit code {f['exitCode']}") +
                    (f" ({f['error']})" if f.get("error") else "")  # the worker's error line: the cause
                    for f, pod in seen]
        limit = max(r.get("maxRestarts", 0) for r in self.agents)
        return (f"in-place restart {restarts}/{limit}: {', '.join(failures) or 'a worker failed'}; the pods were "
                f"kept and training resumes from iteration {self.loaded_iteration}")
