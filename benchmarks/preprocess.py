"""Throughput of ``ascend-engine preprocess``: generated pretraining text and Alpaca data, 1 and 2 workers.

    .venv/bin/python benchmarks/preprocess.py [--size-mb 200] [--workers 1 2] [--keep DIR]

Prints MB/s, records/s, tokens/s and the peak RSS of the largest process for every run, and checks that
every worker count wrote the same bytes. The tokenizer is a byte-level BPE trained here on the generated
text (no downloads), with Qwen's ChatML special tokens.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORDS = ("the of and to in is was for on that with as by at from his her an which were are this be also had "
         "model data training token sequence layer attention parallel tensor pipeline device cluster node "
         "river mountain city history music science language market energy system network 数据 模型 训练 "
         "并行 设备 集群 文本").split()
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def sentences(rng: random.Random, n: int) -> list[str]:
    return [" ".join(rng.choices(WORDS, k=rng.randint(6, 24))).capitalize() + "." for _ in range(n)]


def generate(directory: Path, size_mb: float) -> dict[str, Path]:
    """Two jsonl files of about ``size_mb`` each: pretraining documents and Alpaca records."""
    rng = random.Random(0)
    pool = sentences(rng, 20000)
    target = int(size_mb * 1e6)
    paths = {"pretrain": directory / "pretrain.jsonl", "alpaca": directory / "alpaca.jsonl"}
    for kind, path in paths.items():
        with open(path, "w", encoding="utf-8") as f:
            while f.tell() < target:
                if kind == "pretrain":
                    record = {"text": " ".join(rng.choices(pool, k=rng.randint(5, 60)))}
                else:
                    record = {"instruction": " ".join(rng.choices(pool, k=rng.randint(1, 4))),
                              "input": rng.choice(pool) if rng.random() < 0.4 else "",
                              "output": " ".join(rng.choices(pool, k=rng.randint(2, 12)))}
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return paths


def train_tokenizer(directory: Path, sample: list[str]) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(sample, trainers.BpeTrainer(vocab_size=8000, special_tokens=SPECIAL,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                            additional_special_tokens=SPECIAL[1:]).save_pretrained(directory)
    return directory


def run(argv: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (KiB) of the largest process of one preprocess run."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "ascend_engine", "preprocess", *argv],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"preprocess failed:\n{proc.stderr.read()}")
    proc.stderr.close()
    return wall, usage.ru_maxrss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=200.0, help="size of each generated jsonl file")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--keep", help="work in this directory and keep it (default: a temp dir)")
    args = parser.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="prep-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    inputs = generate(work, args.size_mb)
    tokenizer = train_tokenizer(work / "tokenizer", sentences(random.Random(1), 20000))
    print(f"generated {', '.join(f'{k} {p.stat().st_size / 1e6:.0f} MB' for k, p in inputs.items())} "
          f"and a {8000}-token BPE in {time.perf_counter() - t:.0f}s ({os.cpu_count()} CPUs)")
    print(f"{'data':9} {'workers':>7} {'wall s':>8} {'MB/s':>7} {'records/s':>10} {'tokens/s':>10} "
          f"{'peak RSS MB':>11}  identical")
    for kind, path in inputs.items():
        extra = (["--append-eod"] if kind == "pretrain" else
                 ["--handler-name", "AlpacaStyleInstructionHandler", "--prompt-type", "qwen", "--seq-length", "2048"])
        reference = None
        for workers in args.workers:
            prefix = work / f"{kind}-w{workers}" / kind
            wall, rss = run(["--input", str(path), "--tokenizer-name-or-path", str(tokenizer), "--output-prefix",
                             str(prefix), "--workers", str(workers), *extra])
            manifest = json.loads(Path(f"{prefix}_manifest.json").read_text())
            sums = [(o["bin"]["sha256"], o["idx"]["sha256"]) for o in manifest["outputs"]]
            reference = reference or sums
            mb = path.stat().st_size / 1e6
            print(f"{kind:9} {workers:>7} {wall:>8.1f} {mb / wall:>7.2f} {manifest['records']['read'] / wall:>10.0f} "
                  f"{manifest['tokens'] / wall:>10.0f} {rss / 1024:>11.0f}  {'yes' if sums == reference else 'NO'}")
    print(f"(wall time includes interpreter start and tokenizer load; outputs in {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
