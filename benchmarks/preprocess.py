"""``ascend-engine preprocess`` against a plain copy and Megatron-LM's ``tools/preprocess_data.py``.

    .venv/bin/python benchmarks/preprocess.py [--size-mb 100] [--workers 1 2] [--rounds 3] [--megatron-lm PATH]

Generated pretraining jsonl, ``--append-eod``, every worker count; the contenders run interleaved (copy, ours
w1, Megatron w1, ours w2, ...) for ``--rounds`` rounds, each in its own process. Prints median and spread of
wall and CPU seconds, ratios, peak RSS, whether ours and Megatron's ``.bin``/``.idx`` are byte-identical and
whether every worker count wrote the same bytes. The tokenizer is a byte-level BPE trained here on the
generated text (no downloads), with Qwen's ChatML special tokens.

Megatron-LM (a core_v0.12.1 checkout, ``--megatron-lm PATH``) runs unpatched on CPU with
``--tokenizer-type HuggingFaceTokenizer``; it imports ``six`` and ``einops``:
``.venv/bin/pip install six einops`` first.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sidebyside import Contender, interleave, table  # noqa: E402

WORDS = ("the of and to in is was for on that with as by at from his her an which were are this be also had "
         "model data training token sequence layer attention parallel tensor pipeline device cluster node "
         "river mountain city history music science language market energy system network 数据 模型 训练 "
         "并行 设备 集群 文本").split()
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def sentences(rng: random.Random, n: int) -> list[str]:
    return [" ".join(rng.choices(WORDS, k=rng.randint(6, 24))).capitalize() + "." for _ in range(n)]


def generate(path: Path, size_mb: float) -> Path:
    """A jsonl file of about ``size_mb`` of pretraining documents."""
    rng = random.Random(0)
    pool = sentences(rng, 20000)
    target = int(size_mb * 1e6)
    with open(path, "w", encoding="utf-8") as f:
        while f.tell() < target:
            f.write(json.dumps({"text": " ".join(rng.choices(pool, k=rng.randint(5, 60)))}, ensure_ascii=False)
                    + "\n")
    return path


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


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=100.0, help="size of the generated pretraining jsonl")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--megatron-lm", type=Path, help="Megatron-LM core_v0.12.1 checkout to compare with")
    parser.add_argument("--keep", help="work in this directory and keep it (default: a temp dir)")
    args = parser.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="prep-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    data = generate(work / "pretrain.jsonl", args.size_mb)
    tokenizer = train_tokenizer(work / "tokenizer", sentences(random.Random(1), 20000))
    size = data.stat().st_size
    print(f"generated {size / 1e6:.0f} MB of pretraining jsonl and an 8000-token BPE in {time.perf_counter() - t:.0f}s "
          f"({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f})")

    def out(name: str) -> Path:
        return work / name / "p"

    def fresh(name: str):
        return lambda _round: shutil.rmtree(work / name, ignore_errors=True)

    contenders = [Contender("cp (read + write once)", lambda r: ["cp", str(data), str(work / "copy.jsonl")])]
    for w in args.workers:
        contenders.append(Contender(
            f"ascend-engine preprocess w{w}",
            lambda r, w=w: [sys.executable, "-m", "ascend_engine", "preprocess", "--input", str(data),
                            "--tokenizer-name-or-path", str(tokenizer), "--output-prefix", str(out(f"ours-w{w}")),
                            "--workers", str(w), "--append-eod"], fresh(f"ours-w{w}")))
        if args.megatron_lm:
            peer = args.megatron_lm.resolve()
            contenders.append(Contender(
                f"Megatron-LM preprocess_data w{w}",
                lambda r, w=w, peer=peer: [
                    sys.executable, str(peer / "tools" / "preprocess_data.py"), "--input", str(data),
                    "--output-prefix", str(out(f"megatron-w{w}")), "--tokenizer-type", "HuggingFaceTokenizer",
                    "--tokenizer-model", str(tokenizer), "--workers", str(w), "--append-eod"],
                lambda r, w=w: (shutil.rmtree(work / f"megatron-w{w}", ignore_errors=True),
                                (work / f"megatron-w{w}").mkdir()),
                env=dict(os.environ, PYTHONPATH=str(peer))))
    interleave(contenders, args.rounds)
    print(f"\n{args.rounds} interleaved rounds, {size / 1e6:.0f} MB jsonl, load average now "
          f"{os.getloadavg()[0]:.1f}:")
    print(table(contenders, contenders[0], size))
    by_name = {c.name: c for c in contenders}
    for w in args.workers:
        ours = by_name[f"ascend-engine preprocess w{w}"]
        files = [out(f"ours-w{w}").with_name(f"p_text_document.{ext}") for ext in ("bin", "idx")]
        same_as_w1 = [sha256(f) for f in files] == [
            sha256(out(f"ours-w{args.workers[0]}").with_name(f.name)) for f in files]
        line = f"workers {w}: ours {ours.median:.1f} s, identical to workers {args.workers[0]}: {same_as_w1}"
        if args.megatron_lm:
            peer = by_name[f"Megatron-LM preprocess_data w{w}"]
            identical = all(sha256(f) == sha256(out(f"megatron-w{w}").with_name(f.name)) for f in files)
            ratios = sorted(p / o for p, o in zip(peer.seconds, ours.seconds))
            cpu = statistics.median(peer.cpu) / statistics.median(ours.cpu)
            line += (f"; Megatron-LM {peer.median:.1f} s: ours is {statistics.median(ratios):.2f}x faster "
                     f"({ratios[0]:.2f}-{ratios[-1]:.2f}), CPU {cpu:.2f}x less; byte-identical .bin and .idx: "
                     f"{identical}")
        print(line)
    if len(args.workers) > 1:
        first = by_name[f"ascend-engine preprocess w{args.workers[0]}"].median
        print("scaling: " + ", ".join(f"w{w} {first / by_name[f'ascend-engine preprocess w{w}'].median:.2f}x"
                                       for w in args.workers[1:]) + f" over w{args.workers[0]}")
    print(f"(wall time includes interpreter start and tokenizer load; outputs in {work})")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
