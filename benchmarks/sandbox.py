"""Cost of HumanEval's code sandbox: the same programs run bare (``python -I -S -c``, nothing else) and through
``run_program`` under each isolation this machine offers (bubblewrap, Landlock, and ``none``: the runner with
resource limits only, to separate the runner's own cost from the isolation's).

1. Per-program overhead: ``--programs`` runs of a HumanEval-shaped program (prompt + completion + tests), the
   contenders interleaved program by program (bare, bubblewrap, landlock, none, bare, ...), one at a time.
   Prints median and spread (min-max) of wall ms per program and the median of the per-program differences to
   bare (the overhead; goal: under 50 ms).
2. Throughput of a HumanEval-sized run: ``--problems`` (164) programs, a mix of passing, failing and raising
   ones, with ``--workers`` (2) at a time; contenders interleaved for ``--rounds`` rounds. Prints programs/s,
   median and spread.

    .venv/bin/python benchmarks/sandbox.py [--programs 30] [--problems 164] [--workers 2] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from ascend_engine.evaluate.confinement import Isolation, interpreter, landlock_abi  # noqa: E402
from ascend_engine.evaluate.sandbox import detect_isolation, humaneval_program, run_program  # noqa: E402

PROMPT = 'def sort_even(xs: list) -> list:\n    """The even numbers of xs, sorted."""\n'
TEST = ("def check(f):\n    assert f([3, 2, 8, 1, 4]) == [2, 4, 8]\n    assert f([]) == []\n"
        "    assert f(list(range(1000, 0, -1)))[:3] == [2, 4, 6]\n")
COMPLETIONS = ["    return sorted(x for x in xs if x % 2 == 0)\n",  # passes
               "    return [x for x in xs if x % 2 == 0]\n",  # fails its test
               "    return sorted(xs)[undefined]\n"]  # raises


def program(i: int) -> str:
    return humaneval_program(PROMPT, COMPLETIONS[i % len(COMPLETIONS)], TEST, "sort_even")


def bare(source: str) -> bool:
    """The same program with nothing around it: the interpreter as the sandbox starts it."""
    return subprocess.run([interpreter(), "-I", "-S", "-c", source], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


def contenders() -> dict:
    found = {"bare": bare}
    if detect_isolation().name == "bubblewrap":
        found["bubblewrap"] = lambda s, i=detect_isolation(): run_program(s, 10, 1024, i).passed
    if landlock_abi():
        found["landlock"] = lambda s, i=Isolation("landlock", "", landlock_abi()): run_program(s, 10, 1024, i).passed
    found["none (limits only)"] = lambda s, i=Isolation("none", ""): run_program(s, 10, 1024, i).passed
    return found


def spread(values: list[float], unit: str, scale: float = 1.0) -> str:
    v = [x * scale for x in values]
    return f"median {statistics.median(v):8.1f} {unit}  (min {min(v):7.1f}, max {max(v):7.1f})"


def per_program(runs: dict, programs: int) -> None:
    ms: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(programs):
        source, verdicts = program(i), set()
        for name, run in runs.items():
            start = time.perf_counter()
            verdicts.add(run(source))
            ms[name].append((time.perf_counter() - start) * 1000)
        assert len(verdicts) == 1, f"contenders disagree on program {i}"
    print(f"\nper program, {programs} HumanEval-shaped programs, contenders interleaved, one at a time (wall ms):")
    for name, values in ms.items():
        line = f"  {name:20} {spread(values, 'ms')}"
        if name != "bare":
            over = [a - b for a, b in zip(values, ms["bare"])]
            line += (f"   overhead: median {statistics.median(over):6.1f} ms "
                     f"(min {min(over):6.1f}, max {max(over):6.1f})")
        print(line)


def throughput(runs: dict, problems: int, workers: int, rounds: int) -> None:
    rates: dict[str, list[float]] = {name: [] for name in runs}
    sources = [program(i) for i in range(problems)]
    for r in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            with ThreadPoolExecutor(workers) as pool:
                passed = sum(pool.map(run, sources))
            seconds = time.perf_counter() - start
            rates[name].append(problems / seconds)
            print(f"  round {r + 1}/{rounds} {name}: {seconds:.2f} s, {passed}/{problems} passed", flush=True)
    print(f"\nHumanEval-sized run ({problems} programs, {workers} workers), {rounds} interleaved rounds:")
    for name, values in rates.items():
        ratio = statistics.median(a / b for a, b in zip(values, rates["bare"]))
        print(f"  {name:20} {spread(values, 'programs/s')}   x bare: {ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", type=int, default=30)
    parser.add_argument("--problems", type=int, default=164)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs = contenders()
    print(f"isolation detected: {detect_isolation().describe()}; interpreter {interpreter()}; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    for name, run in runs.items():  # warm caches (the seccomp filter, bwrap's version, the page cache)
        run(program(0))
    per_program(runs, args.programs)
    throughput(runs, args.problems, args.workers, args.rounds)


if __name__ == "__main__":
    main()
