"""Run competing commands side by side: interleaved rounds (A, B, C, A, B, C, ...), each in its own process,
so a machine loaded by others slows every contender alike and the ratios stay meaningful.

Used by convert.py and preprocess.py; prints median and spread (min-max) of wall seconds and peak RSS.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Contender:
    name: str
    command: Callable[[int], list[str]]
    """round number -> argv (a fresh output path per round)."""
    before: Callable[[int], None] | None = None
    """untimed set-up before each round (e.g. removing the previous round's output)."""
    env: dict | None = None
    cwd: str | None = None
    seconds: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def timed(argv: list[str], env: dict | None = None, cwd: str | None = None) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system, children included) and peak RSS (bytes) of the largest process
    of one run; raises with its output on failure. On a loaded machine CPU seconds vary less than wall time."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    output = proc.stdout.read()  # read before waiting: a full pipe would block the child
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.stdout.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"failed: {' '.join(argv)}\n{output.decode(errors='replace')[-4000:]}")
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024


def interleave(contenders: list[Contender], rounds: int, log=print) -> None:
    """``rounds`` rounds of every contender in turn; fills each contender's ``seconds`` and ``rss``."""
    for r in range(rounds):
        for c in contenders:
            if c.before:
                c.before(r)
            os.sync()  # no contender pays for writing back the one before it: each starts with nothing dirty
            s, cpu, rss = timed(c.command(r), c.env, c.cwd)
            c.seconds.append(s)
            c.cpu.append(cpu)
            c.rss.append(rss)
            log(f"  round {r + 1}/{rounds} {c.name}: {s:.2f} s wall, {cpu:.2f} s CPU, peak RSS {rss / 1e9:.2f} GB")


def table(contenders: list[Contender], baseline: Contender, data_bytes: int) -> str:
    """One line per contender: median and spread (min-max) of wall seconds, MB/s, the median (and spread) of
    the per-round ratios to the baseline, median CPU seconds and their ratio, peak RSS."""
    lines = [f"{'':36} {'wall s':>6} {'spread':>11} {'MB/s':>6} {'x ' + baseline.name:>17} {'CPU s':>6} "
             f"{'CPU x':>6} {'RSS GB':>6}"]
    for c in contenders:
        ratios = [s / b for s, b in zip(c.seconds, baseline.seconds)]
        cpu_ratio = statistics.median(c.cpu) / max(statistics.median(baseline.cpu), 1e-9)
        lines.append(f"{c.name:36} {c.median:6.2f} {min(c.seconds):5.2f}-{max(c.seconds):<5.2f} "
                     f"{data_bytes / 1e6 / c.median:6.0f} {statistics.median(ratios):5.2f} "
                     f"({min(ratios):5.2f}-{max(ratios):<5.2f}) {statistics.median(c.cpu):6.2f} {cpu_ratio:6.2f} "
                     f"{max(c.rss) / 1e9:6.2f}")
    return "\n".join(lines)
