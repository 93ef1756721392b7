"""The memory plan (ascend_engine.plan.memory) against measured peak memory of real training on CPU.

Each layout runs the engine's own Trainer under torchrun on CPU (gloo) for a few steps on a model of about 60M
parameters, fp32 (the CPU's precision). Every rank resets its peak RSS (``/proc/self/clear_refs``: 5) right before
the Trainer builds the model, after torch, megatron-core and the process group are up, and reads ``VmHWM`` after the
steps: the growth is what the model, its gradients, the optimizer state and the activations took, the framework's
own memory left out (the estimate is made with overhead 0 to match). Printed per layout and stage: the estimate,
the measurement and their ratio.

    .venv/bin/python benchmarks/plan_memory.py [--layouts tp1pp1,tp2,pp2,dp2-distopt] [--steps 3]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

MIB = 1024 ** 2
# glibc's malloc raises its mmap threshold (up to 32 MiB) each time a large block is freed, after which freed
# activations stay in the heap and in the RSS with no tensor in them: the CPU's counterpart of a device allocator's
# cache, which the estimate does not claim to know. A fixed threshold hands large blocks back at once, so the RSS
# follows the live tensors. --glibc-default measures without it.
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
MODEL = {"numLayers": 8, "hiddenSize": 512, "ffnHiddenSize": 1408, "numAttentionHeads": 8, "vocabSize": 32000,
         "makeVocabSizeDivisibleBy": 128}
TRAINING = {"microBatchSize": 2, "globalBatchSize": 4, "seqLength": 256, "trainIters": 10, "precision": "fp32"}
LAYOUTS = {
    # name: (world size, parallel block, training block over TRAINING)
    "tp1pp1": (1, {}, {}),
    "tp1pp1-selective": (1, {}, {"recomputeGranularity": "selective"}),
    "tp2": (2, {"tensorModelParallelSize": 2}, {}),
    "pp2": (2, {"pipelineModelParallelSize": 2}, {}),
    "dp2-distopt": (2, {"useDistributedOptimizer": True}, {}),
    # activations larger than the model's states: 4 x 1024 tokens a micro-batch
    "long": (1, {}, {"seqLength": 1024, "microBatchSize": 4, "globalBatchSize": 4}),
    "long-full": (1, {}, {"seqLength": 1024, "microBatchSize": 4, "globalBatchSize": 4,
                          "recomputeGranularity": "full"}),
    "long-tp2-sp": (2, {"tensorModelParallelSize": 2, "sequenceParallel": True},
                    {"seqLength": 1024, "microBatchSize": 4, "globalBatchSize": 4}),
}


def config(layout: str) -> dict:
    world, parallel, training = LAYOUTS[layout]
    return {"device": "cpu", "model": MODEL, "parallel": parallel, "training": {**TRAINING, **training},
            "optimizer": {"lrWarmupIters": 0}, "observability": {"metricsPort": 0}}


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def worker(path: str, steps: int) -> None:
    """One rank: build the engine's Trainer from the config and train ``steps`` steps; print the RSS growth."""
    import importlib

    for module in ("torch", "megatron.core.models.gpt", "megatron.core.optimizer"):
        importlib.import_module(module)  # before the baseline, as everything the Trainer needs
    import yaml

    from ascend_engine.config.train import TrainConfig
    from ascend_engine.device import select_backend
    from ascend_engine.train import loop

    cfg = TrainConfig.model_validate(yaml.safe_load(Path(path).read_text()))
    backend = select_backend("cpu")
    Path("/proc/self/clear_refs").write_text("5")  # the peak RSS starts again from the current RSS
    base = _status("VmRSS")
    trainer = loop.Trainer(cfg, backend)
    for _ in range(steps):
        trainer.train_step()
    peak = _status("VmHWM")
    info = trainer.info
    print("PLAN_MEMORY " + json.dumps({"rank": info.rank, "pp_rank": info.pp_rank,
                                       "growth": peak - base}), flush=True)
    loop.destroy_parallel()


def run(layout: str, steps: int) -> list[dict]:
    world = LAYOUTS[layout][0]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "job.yaml"
        path.write_text(json.dumps(config(layout)))

        cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", str(world), "--master-addr",
               "127.0.0.1", "--master-port", str(_port()), __file__, "--worker", str(path), "--steps", str(steps)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **MALLOC}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode:
        sys.exit(f"{layout}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    # the ranks share one stdout: their lines may interleave
    return [json.loads(found) for found in re.findall(r"PLAN_MEMORY (\{[^}]*\})", proc.stdout)]


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--glibc-default", action="store_true", help="leave glibc's malloc thresholds alone")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.glibc_default:
        MALLOC.clear()
    if args.worker:
        worker(args.worker, args.steps)
        return
    from ascend_engine.config.train import TrainConfig
    from ascend_engine.plan.memory import estimate

    print(f"{'layout':18} {'stage':>5} {'estimate MiB':>12} {'measured MiB':>12} {'ratio':>6}  (params, grads, "
          f"optimizer, activations MiB)")
    for layout in args.layouts.split(","):
        cfg = TrainConfig.model_validate(config(layout))
        plan = estimate(cfg, LAYOUTS[layout][0])
        ranks = run(layout, args.steps)
        for stage in plan.stages:
            measured = max(r["growth"] for r in ranks if r["pp_rank"] == stage.stage)
            parts = ", ".join(f"{x / MIB:.0f}" for x in (stage.params_bytes, stage.grads_bytes,
                                                            stage.optimizer_bytes, stage.activations_bytes))
            print(f"{layout:18} {stage.stage:>5} {stage.total_bytes / MIB:>12.0f} {measured / MIB:>12.0f} "
                  f"{stage.total_bytes / measured:>6.2f}  ({parts})", flush=True)


if __name__ == "__main__":
    main()
