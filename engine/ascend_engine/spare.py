"""``python -m ascend_engine.spare``: a warm spare worker, started by the launcher beside a pod's workers.

It imports torch, the device runtime and Megatron-core and the engine's training modules, says it is ready (a file
named by ``ASCEND_SPARE_READY``), and waits on its standard input. When a worker of its pod dies and the job
restarts in process (``ascend_engine.inprocess``), the pod's torchrun agent writes it one JSON line, the dead
worker's environment and arguments, and it becomes that worker: the same command, run in this process
(``runpy``), joining the restarted ranks' new process group. Its end of the pipe closing (the launcher gone)
ends it.

What it costs is its resident memory (measured by ``benchmarks/recovery.py``: torch and Megatron-core imported,
no model, no device memory; about 0.9 GiB on CPU here) and, once, the CPU time of those imports, which it spends
after the job's first promoted checkpoint (``inplace.checkpointed``): the job's start-up does not wait for it, a
restart before any checkpoint starts from scratch anyway, and a job that never saves one pays nothing.
"""
from __future__ import annotations

import atexit
import gc
import json
import os
import runpy
import signal
import subprocess
import sys
import time


def device_of(args: list[str]) -> str:
    """The job's device, from the worker's ``--device`` or its config file (``auto`` when neither says)."""
    for i, arg in enumerate(args):
        if arg == "--device" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--device="):
            return arg.split("=", 1)[1]
    config = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config"), None)
    try:
        import yaml

        with open(config or "", encoding="utf-8") as f:
            doc = yaml.safe_load(f) or {}
        train = (doc.get("spec") or {}).get("train", doc) if isinstance(doc, dict) else {}
        return str(train.get("device") or "auto")
    except (OSError, ValueError, AttributeError):
        return "auto"


def warm(args: list[str]) -> None:
    """What a worker imports before its first step, so that taking a rank's place costs none of it."""
    import torch  # noqa: F401

    from .device import select_backend

    backend = select_backend(device_of(args))
    backend.apply()  # before Megatron is imported, as a worker does
    import megatron.core.distributed  # noqa: F401
    import megatron.core.optimizer  # noqa: F401
    import megatron.core.pipeline_parallel  # noqa: F401

    from .checkpoint import training  # noqa: F401
    from .data import build  # noqa: F401
    from .models import gpt  # noqa: F401
    from .train import loop, optim  # noqa: F401

    if backend.name == "cpu":
        rehearse(backend)
        # The rehearsal's model and process groups hold gloo's loop threads (51 here) until collected: left alone
        # they woke often enough to cost an idle spare 15 ms of CPU a second (with parallel.destroy_parallel's
        # release of the groups Megatron-core keeps, none is left).
        gc.collect()


def rehearse(backend) -> None:
    """Build a tiny model and its optimizer once, in a world of one, and let them go: what Megatron-core and torch
    do only the first time (lazy imports, the optimizer's first construction: 1.9 s of a spare's 2.4 s from joining
    to its first step here) is then done. Not on an accelerator, where it would take a device context on a device
    that may not be this spare's."""
    import torch
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    from .config.train import TrainConfig
    from .models.gpt import build_gpt_model
    from .parallel import destroy_parallel, init_parallel
    from .train.optim import build_optimizer

    cfg = TrainConfig.model_validate({"device": "cpu", "model": {"numLayers": 1, "hiddenSize": 32,
                                                                 "numAttentionHeads": 2, "vocabSize": 64},
                                      "training": {"microBatchSize": 1, "globalBatchSize": 1, "seqLength": 8}})
    saved = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE") if k in os.environ}
    try:
        init_parallel(backend, 1, 1, 0, store=torch.distributed.HashStore())
        model = build_gpt_model(cfg.model, cfg.parallel, 8, torch.float32, None, seed=0)
        ddp = DistributedDataParallel(config=model.config, module=model,
                                      ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=True))
        build_optimizer(cfg, [ddp], torch.float32)
    except Exception as e:  # noqa: BLE001 - a rehearsal: the spare works without it, only slower
        print(f"[spare] could not rehearse a model build ({type(e).__name__}: {e})", file=sys.stderr, flush=True)
    finally:
        destroy_parallel()
        os.environ.update(saved)


def become(args: list[str]) -> None:
    """Run the worker's command (torchrun's arguments to the interpreter) in this process."""
    args = list(args)
    while args and args[0].startswith("-") and args[0] != "-m":
        args.pop(0)  # -u and the like: this process is already running
    if args[:1] == ["-m"]:
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = args
        sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
        runpy.run_path(args[0], run_name="__main__")


def main() -> None:
    started = time.time()
    args = json.loads(os.environ.get("ASCEND_SPARE_ARGS", "[]"))
    warm(args)
    rss = _rss_mib()
    ready = os.environ.get("ASCEND_SPARE_READY")
    if ready:
        with open(ready, "w", encoding="utf-8") as f:
            json.dump({"pid": os.getpid(), "seconds": time.time() - started, "rssMiB": rss}, f)
    print(f"[spare] warm spare {os.getpid()} ready in {time.time() - started:.1f}s ({rss:.0f} MiB resident)",
          file=sys.stderr, flush=True)
    line = sys.stdin.readline()
    if not line:
        return  # the launcher is gone, or it let this spare go
    job = json.loads(line)
    sys.stdin.close()
    os.environ.update(job["env"])
    print(f"[spare] warm spare {os.getpid()} takes the place of rank {os.environ.get('RANK')} (local rank "
          f"{os.environ.get('LOCAL_RANK')})", file=sys.stderr, flush=True)
    become(job["args"])


SPARE_MIN_AVAILABLE_MIB = 2048  # no spare when less host memory than this is available (it needs ~0.5 GiB)


def available_mib() -> float | None:
    """Host memory this pod can still use: the cgroup's limit less its usage when there is one, else the
    kernel's MemAvailable."""
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as f:
            cap = f.read().strip()
        if cap != "max":
            with open("/sys/fs/cgroup/memory.current", encoding="ascii") as f:
                return (int(cap) - int(f.read().strip())) / 2**20
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:")) / 1024
    except (OSError, StopIteration, ValueError):
        return None


class WarmSpares:
    """The launcher's side: up to ``count`` spares for this pod, started once the job has promoted a checkpoint,
    and started again after one is taken."""

    def __init__(self, count: int, folder: str) -> None:
        self.count, self.folder = count, folder
        self.procs: list[tuple[subprocess.Popen, str]] = []
        self.started = False
        self._args: list[str] | None = None
        atexit.register(self.stop)

    def start(self, entrypoint: str, args: list[str]) -> None:
        self.started = True
        if not os.path.basename(entrypoint).startswith("python"):
            return  # torchrun --no-python: a binary, nothing to warm
        self._args = list(args)
        self._fill()

    def _fill(self) -> None:
        while len([p for p, _ in self.procs if p.poll() is None]) < self.count:
            free = available_mib()
            if free is not None and free < SPARE_MIN_AVAILABLE_MIB:
                print(f"[torchrun] no warm spare: {free:.0f} MiB of host memory available, fewer than "
                      f"{SPARE_MIN_AVAILABLE_MIB}", file=sys.stderr, flush=True)
                return
            ready = os.path.join(self.folder, f"spare-{time.time_ns()}.json")
            env = {**os.environ, "ASCEND_SPARE_READY": ready, "ASCEND_SPARE_ARGS": json.dumps(self._args),
                   "PYTHONUNBUFFERED": "1"}
            proc = subprocess.Popen([sys.executable, "-m", "ascend_engine.spare"], stdin=subprocess.PIPE, env=env,
                                    start_new_session=True)  # its own group, as torchrun's workers
            self.procs.append((proc, ready))

    def ready(self) -> subprocess.Popen | None:
        """A spare that has finished its imports, if any."""
        self.procs = [(p, r) for p, r in self.procs if p.poll() is None]
        return next((p for p, r in self.procs if os.path.exists(r)), None)

    def take(self, proc: subprocess.Popen, env: dict[str, str], args: list[str]) -> subprocess.Popen:
        """Hand ``proc`` a worker's environment and arguments; another spare starts in its place."""
        self.procs = [(p, r) for p, r in self.procs if p is not proc]
        assert proc.stdin is not None
        proc.stdin.write((json.dumps({"env": env, "args": list(args)}) + "\n").encode())
        proc.stdin.close()
        self._fill()
        return proc

    def stop(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
        self.procs = []


def _rss_mib() -> float:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration, ValueError):
        return 0.0


if __name__ == "__main__":
    main()
