"""The recovery ladder's rungs below Replace, measured side by side on this machine with the real launcher, engine,
warm spare and the operator's own accounting; and what the in-process level costs when nothing fails.

Two "pods" of one process each on this machine, as the operator renders them (``python -m ascend_engine.launcher``
with the c10d rendezvous on pod 0, ``--max-restarts=1``, ``NODE_RANK``), training the quickstart's model
(examples/quickstart.yaml: TP=2, checkpoint every 5 steps). Rank 1 fails at its step 12 in three ways, one run
each, the three interleaved, ``--rounds`` times (3):

* ``InProcess raise``: rank 1 raises; every rank restarts the training function in its own process;
* ``InProcess kill``: rank 1's process is killed (held before its step until pod 1's warm spare is ready); the
  spare takes its place, rank 0 restarts in its process, the checkpoint comes from host memory (rank 1's own files
  from rank 0's replica);
* ``InPlace kill``: the same kill with the in-process level off (``ASCEND_INPROCESS_RESTARTS=0``): torchrun's
  agents start new workers, which import torch and Megatron-core and read the checkpoint files.

Each recovery's parts come from rank 0's metrics, read every 0.3 s as the operator reads them and folded by the
operator's own code (``ascend_operator.progress.scrape``, ``ascend_operator.recovery.goodput``): detection, stopping,
podStart, rendezvous, checkpointLoad, retrain, total; plus "trained again", the seconds from the kill (or the raise)
until rank 0 logged a step again, read from its log. Printed as the median of the rounds with min and max.

Then ``--steady`` runs (3 each) of 60 uninterrupted steps with the in-process level on (a warm spare per pod,
ready before the timed steps; every checkpoint kept in memory and replicated) and off, interleaved: the median
wall time of a step (rank 0's step lines) and the CPU time a step of both workers and of both launchers (``/proc``,
steps 11-70: less moved by other work on a shared machine), each with the ratio; what keeping and replicating a
checkpoint took; and the level's own work counted where it runs (the idle spares' CPU, the keeping, the agents'
difference) against a step's CPU, which other work on the machine does not blur. And the warm spare's resident
memory beside a worker's.

    .venv/bin/python benchmarks/recovery.py [--rounds 3] [--steady 3]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "engine" / "inprocess_worker.py"  # the engine's train command, a fault aimed by files
STEP = re.compile(r"^ iteration +(\d+)/ +\d+ \| .*elapsed time per iteration \(ms\): ([\d.]+) \|.*lm loss: (\S+) \|",
                  re.M)
FAULT_AT = 12
PARTS = ("detection", "stopping", "podStart", "rendezvous", "checkpointLoad", "retrain")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(folder: Path, iters: int, metrics_port: int) -> Path:
    docs = list(yaml.safe_load_all((ROOT / "examples" / "quickstart.yaml").read_text()))
    train = next(d for d in docs if d and d.get("kind") == "AscendTrainJob")["spec"]["train"]
    train["training"]["trainIters"] = iters
    train["checkpoint"] = {"save": str(folder / "ckpt"), "load": str(folder / "ckpt"), "saveInterval": 5}
    train["observability"] = {"metricsPort": metrics_port, "logInterval": 1}
    train.pop("data", None)
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(train))
    return path


def launch(folder: Path, pod: int, port: int, cfg: Path, in_process: bool) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "ascend_engine.launcher", "--nnodes=2", "--nproc-per-node=1",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=bench-{port}",
           f"--rdzv-conf=is_host={int(pod == 0)}", "--local-addr=127.0.0.1", "--max-restarts=1",
           str(WORKER), str(folder), "train", "--config", str(cfg)]
    env = {**os.environ, "NODE_RANK": str(pod), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "POD_IP": "127.0.0.1",
           "ASCEND_INPROCESS_RESTARTS": "2" if in_process else "0", "ASCEND_WARM_SPARES": "1",
           "ASCEND_TERMINATION_LOG": str(folder / f"termination-{pod}"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(WORKER.parent), os.environ.get("PYTHONPATH")]))}
    with open(folder / f"launcher-{pod}.log", "w") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def at(folder: Path, rank: int) -> dict:
    try:
        return json.loads((folder / f"at-{rank}").read_text())
    except (OSError, ValueError):
        return {}


def log(folder: Path, pod: int) -> str:
    try:
        return (folder / f"launcher-{pod}.log").read_text()
    except OSError:
        return ""


def rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration):
        return float("nan")


class Run:
    """One job of two launchers, its rank 0 read as the operator reads it."""

    def __init__(self, kind: str, iters: int, fault: str | None, in_process: bool) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix=f"recovery-{kind.replace(' ', '-')}-"))
        self.metrics = free_port()
        cfg = config(self.folder, iters, self.metrics)
        port = free_port()
        self.in_process = in_process
        if fault:
            (self.folder / "hold").write_text(json.dumps([1, FAULT_AT]))
        self.procs = [launch(self.folder, pod, port, cfg, self.in_process) for pod in (0, 1)]
        self.status: dict = {"startTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def read(self) -> None:
        from ascend_operator.progress.scrape import scrape
        from ascend_operator.recovery import goodput

        figures = scrape(f"http://127.0.0.1:{self.metrics}/metrics", timeout=0.5)
        if figures:
            self.status = goodput.fold({**self.status, "progress": figures}, time.time())

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def wait(self, until, seconds: float = 300) -> None:
        deadline = time.monotonic() + seconds
        while not until():
            if time.monotonic() > deadline or not self.alive():
                raise SystemExit(f"{self.folder}: gave up waiting; launchers {[p.poll() for p in self.procs]}\n"
                                 + log(self.folder, 0)[-3000:] + log(self.folder, 1)[-3000:])
            self.read()
            time.sleep(0.3)

    def finish(self, seconds: float = 300) -> None:
        deadline = time.monotonic() + seconds
        while any(p.poll() is None for p in self.procs) and time.monotonic() < deadline:
            self.read()
            time.sleep(0.3)
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def recovery(kind: str) -> dict:
    fault = "raise" if kind.endswith("raise") else "kill"
    run = Run(kind, 30, fault, kind.startswith("InProcess"))
    out: dict = {}
    if run.in_process:
        run.wait(lambda: "[spare] warm spare" in log(run.folder, 1))  # ready, as it would be long into a run
    run.wait(lambda: at(run.folder, 1).get("iteration") == FAULT_AT)  # rank 1 held before its step
    victim = at(run.folder, 1)["pid"]
    out["workerRssMiB"] = rss_mib(victim)
    seen = len(log(run.folder, 0))
    if fault == "kill":
        os.kill(victim, signal.SIGKILL)
    else:
        (run.folder / "raise").write_text(json.dumps([1, FAULT_AT]))
    failed = time.monotonic()
    (run.folder / "hold").unlink()
    run.wait(lambda: STEP.search(log(run.folder, 0)[seen:]) is not None)
    out["trainedAgain"] = round(time.monotonic() - failed, 2)
    run.wait(lambda: any(r.get("totalSeconds") is not None for r in run.status.get("recoveries") or []))
    run.finish()
    ready = re.search(r"ready in ([\d.]+)s \(([\d.]+) MiB resident\)", log(run.folder, 1))
    if ready:
        out["spareReadySeconds"], out["spareRssMiB"] = float(ready[1]), float(ready[2])
    [entry] = [r for r in run.status["recoveries"] if r.get("totalSeconds") is not None][:1]
    expected = "InProcess" if run.in_process else "InPlace"
    if entry["level"] != expected:
        raise SystemExit(f"{kind}: recovered at level {entry['level']}, not {expected}: {entry}")
    out.update(entry["seconds"], total=entry["totalSeconds"], lost=entry.get("lostIterations"),
               source=entry.get("message", ""))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def written_before(folder: Path, seconds: float) -> bool:
    """Whether no file under ``folder`` was written in the last ``seconds``."""
    times = []
    for path in folder.rglob("*"):
        try:
            times.append(path.stat().st_mtime)
        except FileNotFoundError:  # a temporary file renamed meanwhile: something is being written
            return False
    return bool(times) and time.time() - max(times) > seconds


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (workers, spares and what they started)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii") as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except OSError:
                pass
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def is_spare(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"ascend_engine.spare" in f.read()
    except OSError:
        return False


def steady(in_process: bool) -> dict[str, float | None]:
    """An uninterrupted run, steps 12-71. Rank 1 waits before its step 11 until both pods' warm spares are ready
    (with the level on; the same wait point with it off), so what is timed is the level's steady cost: an idle
    spare, and each checkpoint kept and replicated at its promotion. The spare's imports, once, are not in it: they
    are reported beside (``spareReadySeconds``). Returns the median wall ms a step (rank 0's lines) and, over the
    60 steps, CPU ms a step of the two workers, of the two launchers (torchrun's agents) and of the spares, and the
    ms keeping and replicating took at a promotion."""
    run = Run("steady-on" if in_process else "steady-off", 71, None, in_process)
    (run.folder / "hold").write_text(json.dumps([1, 11]))
    if in_process:  # both pods' spares: one still importing would take a core from the timed steps
        run.wait(lambda: all("[spare] warm spare" in log(run.folder, pod) for pod in (0, 1)))
    run.wait(lambda: at(run.folder, 1).get("iteration") == 11)
    # the checkpoint of iteration 10 is written in the background: with the level off nothing else waits for it,
    # so without this its writing fell into the timed steps of those runs only
    run.wait(lambda: written_before(run.folder / "ckpt", 2.0))
    workers = [at(run.folder, rank)["pid"] for rank in (0, 1)]
    agents = [p.pid for p in run.procs]
    spares = [pid for agent in agents for pid in descendants(agent) if is_spare(pid)]
    groups = {"workers": workers, "agents": agents, "spares": spares}
    began = {name: sum(cpu_seconds(pid) for pid in pids) for name, pids in groups.items()}
    (run.folder / "hold").unlink()
    run.wait(lambda: min(at(run.folder, rank).get("iteration", 0) for rank in (0, 1)) >= 71)  # steps 11-70 done
    used = {name: sum(cpu_seconds(pid) for pid in pids) - began[name] for name, pids in groups.items()}
    run.finish()
    steps = [float(ms) for it, ms, _ in STEP.findall(log(run.folder, 0)) if int(it) > 11]
    if [p.returncode for p in run.procs] != [0, 0] or len(steps) < 50:
        raise SystemExit(f"steady run failed: {run.folder}")
    kept = re.search(r"median ([\d.]+) ms a promotion", log(run.folder, 0))
    return {"wall": statistics.median(steps), **{name: 1000 * cpu / 60 for name, cpu in used.items()},
            "kept": float(kept[1]) if kept else None}


def spread(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steady", type=int, default=3, help="uninterrupted runs with the level on and off (0: none)")
    args = ap.parse_args()
    kinds = ["InProcess raise", "InProcess kill", "InPlace kill"]
    results: dict[str, list[dict]] = {k: [] for k in kinds}
    for r in range(args.rounds):  # --rounds 0: the steady runs alone
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            results[kind].append(recovery(kind))
            print(f"round {r + 1} {kind}: {json.dumps(results[kind][-1])}", flush=True)
    load = os.getloadavg()
    print(f"\n{os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    if args.rounds:
        print(f"median (min-max) of {args.rounds} runs each, seconds")
        print(f"{'':16}" + "".join(f"{k:>22}" for k in kinds))
        for row in [*PARTS, "total", "trainedAgain", "lost"]:
            print(f"{row:16}" + "".join(f"{spread([x.get(row) for x in results[k]]):>22}" for k in kinds))
        spare = [x["spareRssMiB"] for k in kinds for x in results[k] if "spareRssMiB" in x]
        worker = [x["workerRssMiB"] for k in kinds for x in results[k] if "workerRssMiB" in x]
        ready = [x["spareReadySeconds"] for k in kinds for x in results[k] if "spareReadySeconds" in x]
        print(f"warm spare: {spread(spare)} MiB resident once ready ({spread(ready)} s to import), a training "
              f"worker {spread(worker)} MiB")
    if args.steady:
        on, off = [], []
        for r in range(args.steady):
            for level in ((True, False) if r % 2 == 0 else (False, True)):
                (on if level else off).append(steady(level))
                print(f"steady {r + 1} level {'on' if level else 'off'}: {(on if level else off)[-1]}", flush=True)
        for key, what in (("wall", "wall ms a step (rank 0's step lines)"),
                          ("workers", "CPU ms a step (both workers, steps 11-70)"),
                          ("agents", "CPU ms a step (both launchers, torchrun's agents)")):
            a, b = [x[key] for x in on], [x[key] for x in off]
            ratios = [x / y for x, y in zip(a, b)]
            print(f"uninterrupted, {what}: in-process level on {spread(a)}, off {spread(b)}; ratio on/off "
                  f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
        print(f"keeping and replicating each promoted checkpoint (every 5 steps): {spread([x['kept'] for x in on])} ms")
        # What the level does that the run without it does not, each counted where it runs, over the same steps:
        # the idle spares' CPU, each promotion's keep-and-replicate (12 in 60 steps), the agents' difference.
        spare = statistics.median(x["spares"] for x in on)
        kept = statistics.median(x["kept"] or 0 for x in on) * 12 / 60
        agents = statistics.median(x["agents"] for x in on) - statistics.median(x["agents"] for x in off)
        step = statistics.median(x["workers"] for x in off)
        added = spare + kept + max(agents, 0.0)
        print(f"the level's own work a step, counted where it runs: idle spares {spare:.2f} ms, keeping checkpoints "
              f"{kept:.2f} ms, agents {agents:+.2f} ms; {added:.2f} ms of a {step:.1f} ms step's CPU "
              f"({100 * added / step:.2f}%)")

if __name__ == "__main__":
    main()
