"""DPO step time against SFT step time on the same model and the same tokens.

SFT trains on 2G sequences per step (the chosen and the rejected reply of G pairs, as plain instruction samples);
DPO trains on the G pairs: the policy's forward+backward over the same 2G rows plus the frozen reference's
forward over them. A forward is about a third of forward+backward, so the expected ratio is about 4/3.

Each block runs ``ascend-engine train`` once per stage (a fresh process, first iterations dropped as warm-up) and
the blocks alternate SFT, DPO, SFT, DPO, ... so load on a shared machine hits both alike; the script prints the
median and spread of each and the ratio of medians.

    python benchmarks/dpo_step.py [--blocks 3 --steps 6 --hidden-size 256 --num-layers 4 --seq-length 256]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

MS = re.compile(r"elapsed time per iteration \(ms\): ([\d.]+)")


def write(prefix: Path, rows: list[tuple[np.ndarray, np.ndarray]]) -> None:
    from ascend_engine.prep.indexed import IndexedDatasetWriter

    for key in ("input_ids", "attention_mask", "labels"):
        w = IndexedDatasetWriter(str(prefix).replace("KEY", key), np.int32)
        pick = {"input_ids": lambda r: r[0], "attention_mask": lambda r: np.ones_like(r[0]),
                "labels": lambda r: r[1]}[key]
        w.add(np.concatenate([pick(r) for r in rows]).astype(np.int32), np.array([len(r[0]) for r in rows]))
        w.finish()
        w.commit()


def make_data(root: Path, pairs: int, seq: int, vocab: int) -> None:
    rng = np.random.default_rng(0)
    sides = {"chosen": [], "rejected": []}
    for _ in range(pairs):
        prompt = rng.integers(0, vocab, seq // 2)
        for side in sides:
            reply = rng.integers(0, vocab, seq - seq // 2)
            sides[side].append((np.concatenate([prompt, reply]), np.concatenate([np.full(len(prompt), -100), reply])))
    for side, rows in sides.items():
        write(root / f"pairs_packed_{side}_KEY_document", rows)
    write(root / "sft_packed_KEY_document", sides["chosen"] + sides["rejected"])


def run(cfg: dict, path: Path, warmup: int) -> tuple[float, float]:
    path.write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")}
    proc = subprocess.run([sys.executable, "-m", "ascend_engine.cli", "train", "--config", str(path)],
                          capture_output=True, text=True, env=env)
    if proc.returncode:
        sys.exit(proc.stderr[-3000:])
    times = [float(m) for m in MS.findall(proc.stdout)][warmup:]
    return statistics.median(times), min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--pairs", type=int, default=4, help="pairs per step (G)")
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--seq-length", type=int, default=256)
    p.add_argument("--vocab-size", type=int, default=1000)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_data(root, 4 * args.pairs, args.seq_length, args.vocab_size)
        base = {"device": args.device,
                "model": {"numLayers": args.num_layers, "hiddenSize": args.hidden_size, "numAttentionHeads": 4,
                          "vocabSize": args.vocab_size},
                "optimizer": {"lrDecayStyle": "constant"}, "observability": {"metricsPort": 0}}
        training = {"seqLength": args.seq_length, "trainIters": args.warmup + args.steps}
        sft = {**base, "data": {"dataPath": [str(root / "sft")], "isInstructionDataset": True},
               "training": {**training, "microBatchSize": 2 * args.pairs, "globalBatchSize": 2 * args.pairs}}
        dpo = {**base, "stage": "dpo", "data": {"dataPath": [str(root / "pairs")]},
               "training": {**training, "microBatchSize": args.pairs, "globalBatchSize": args.pairs}}
        results: dict[str, list[float]] = {"sft": [], "dpo": []}
        fastest: dict[str, list[float]] = {"sft": [], "dpo": []}
        for block in range(args.blocks):
            for name, cfg in (("sft", sft), ("dpo", dpo)):
                median, best = run(cfg, root / f"{name}.yaml", args.warmup)
                results[name].append(median)
                fastest[name].append(best)
            print(f"block {block + 1}: sft {results['sft'][-1]:.1f} ms/step (fastest {fastest['sft'][-1]:.1f}), "
                  f"dpo {results['dpo'][-1]:.1f} ms/step (fastest {fastest['dpo'][-1]:.1f})", flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    spread = {k: (max(v) - min(v)) / med[k] for k, v in results.items()}
    print(f"device {args.device} ({os.cpu_count()} CPU threads), layers {args.num_layers}, hidden {args.hidden_size}, "
          f"seq {args.seq_length}, {args.pairs} pairs = {2 * args.pairs} rows per step, {args.blocks} blocks")
    for k in ("sft", "dpo"):
        print(f"{k}: median {med[k]:9.1f} ms/step, spread {100 * spread[k]:.0f}% (max-min over median)")
    print(f"dpo / sft = {med['dpo'] / med['sft']:.2f} (expected about 1.33: + a reference forward per row)")
    # On a shared machine the fastest step of each run is the one least disturbed by other load.
    best = {k: statistics.median(v) for k, v in fastest.items()}
    print(f"fastest steps: sft {best['sft']:.1f}, dpo {best['dpo']:.1f} ms/step (medians over blocks), "
          f"dpo / sft = {best['dpo'] / best['sft']:.2f}")


if __name__ == "__main__":
    main()
