"""What a checkpoint costs the training steps around it: synchronous save vs background save vs no save.

One window is a save (or none) followed by ``--window`` training steps, timed from before the save to after the
last step and the checkpoint's promotion (manifest, rename, tracker). The figure that matters is the window's
extra time over a window without a save: a synchronous save costs serialisation + writing + fsync + hashing; a
background one only the in-memory serialisation, the rest overlapping the steps. The three kinds are interleaved
(order rotating every round) on the same Trainer so machine drift hits all alike; medians and spread over rounds.
One process (a world of one) on the synthetic data; ``--device cuda`` on a GPU.

    .venv/bin/python benchmarks/checkpoint_save.py [--hidden-size 512 --num-layers 8 --rounds 5 --window 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):7.2f}  (min {min(values):7.2f}, max {max(values):7.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "npu"])
    ap.add_argument("--hidden-size", type=int, default=512)
    ap.add_argument("--num-layers", type=int, default=8)
    ap.add_argument("--seq-length", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--window", type=int, default=5, help="training steps after each save")
    ap.add_argument("--dir", help="where to write checkpoints (default: a temporary folder in /tmp)")
    args = ap.parse_args()
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        os.environ.pop(k, None)

    from ascend_engine.config.train import TrainConfig
    from ascend_engine.device import select_backend
    from ascend_engine.parallel import destroy_parallel
    from ascend_engine.train.loop import Trainer

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        cfg = TrainConfig.model_validate({
            "device": args.device,
            "model": {"numLayers": args.num_layers, "hiddenSize": args.hidden_size, "numAttentionHeads": 8,
                      "vocabSize": 32000},
            "training": {"microBatchSize": 2, "globalBatchSize": 4, "seqLength": args.seq_length,
                         "trainIters": 10_000},
            "optimizer": {"lr": 1e-4},
            "checkpoint": {"save": tmp, "keepLastCheckpoints": 1},
            "observability": {"metricsPort": 0},
        })
        trainer = Trainer(cfg, select_backend(args.device))
        for _ in range(2):  # warm-up: allocator, first-step costs, a first save
            trainer.train_step()
        trainer.save()
        size = sum(p.stat().st_size for p in Path(tmp).rglob("*") if p.is_file())

        def window(kind: str) -> tuple[float, float]:
            """(window seconds, seconds the save call held the training thread)."""
            start = time.perf_counter()
            if kind != "none":
                trainer.save(blocking=kind == "sync")
            held = time.perf_counter() - start
            for _ in range(args.window):
                trainer.train_step()
                trainer.finish_save(wait=False)
            trainer.finish_save()
            return time.perf_counter() - start, held

        kinds = ["none", "sync", "async"]
        seconds: dict[str, list[float]] = {k: [] for k in kinds}
        held: dict[str, list[float]] = {k: [] for k in kinds}
        for r in range(args.rounds):
            for kind in kinds[r % 3:] + kinds[:r % 3]:
                s, h = window(kind)
                seconds[kind].append(s)
                held[kind].append(h)
        destroy_parallel()

    base = statistics.median(seconds["none"])
    print(f"checkpoint {size / 1e6:.0f} MB (model + Adam state, fp32), {args.window} steps per window, "
          f"{args.rounds} rounds, device {args.device}")
    for kind in kinds:
        extra = [s - base for s in seconds[kind]]
        print(f"  {kind:5s}  window s {spread(seconds[kind])}   extra over no save s {spread(extra)}   "
              f"training thread held s {spread(held[kind])}")
    sync_extra = statistics.median(seconds["sync"]) - base
    async_extra = statistics.median(seconds["async"]) - base
    print(f"background save costs the steps {async_extra:.2f}s per checkpoint vs {sync_extra:.2f}s synchronous "
          f"({async_extra / sync_extra:.2f}x)" if sync_extra > 0 else "synchronous save cost nothing measurable")


if __name__ == "__main__":
    main()
