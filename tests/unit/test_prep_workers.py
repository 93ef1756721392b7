"""``--workers N`` writes the same bytes as ``--workers 1``."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from prep_support import preprocess, tokenizer_dir, write_jsonl  # noqa: F401

WORDS = "the quick brown fox jumps over lazy dog eat well sleep 你好 世界 data tokens".split()


def corpus(kind: str, n: int) -> list[dict]:
    rng = random.Random(1)
    say = lambda k: " ".join(rng.choices(WORDS, k=rng.randint(1, k)))  # noqa: E731
    if kind == "pretrain":
        return [{"text": say(60)} for _ in range(n)]
    return [{"instruction": say(20), "input": say(5) if i % 3 else "", "output": say(30)} for i in range(n)]


@pytest.mark.parametrize("kind, extra", [
    ("pretrain", ("--append-eod",)),
    ("alpaca", ("--handler-name", "AlpacaStyleInstructionHandler", "--prompt-type", "qwen", "--seq-length", "96",
                "--neat-pack")),
])
def test_workers_give_identical_bytes(tmp_path, tokenizer_dir, kind, extra):
    data = write_jsonl(tmp_path / "in.jsonl", corpus(kind, 1500))
    outputs = {}
    for workers in (1, 2):
        prefix = tmp_path / f"w{workers}" / "data"
        assert preprocess("--input", data, "--tokenizer-name-or-path", tokenizer_dir, "--output-prefix", prefix,
                          "--workers", workers, "--chunk-size", "64", "--log-interval", "500", *extra) == 0
        outputs[workers] = {p.name: p.read_bytes() for p in prefix.parent.iterdir() if p.suffix in (".bin", ".idx")}
        manifest = json.loads(Path(f"{prefix}_manifest.json").read_text())
        assert manifest["workers"] == workers and manifest["records"]["written"] == 1500
    assert len(outputs[1]) == (2 if kind == "pretrain" else 6)
    assert outputs[1] == outputs[2]
