"""`ascend-engine generate`: a model trained (PP=2) to memorise a sentence continues its prompt with it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_train_data import MODEL, config
from test_train_torchrun import VENV_BIN, assert_ok, free_port, run_train

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from prep_support import build_tokenizer, preprocess, write_jsonl  # noqa: E402

SENTENCE = "The quick brown fox jumps over the lazy dog."


@pytest.mark.engine
def test_greedy_generation_reproduces_a_memorised_sentence(tmp_path):
    tok = build_tokenizer(tmp_path / "tok")
    assert preprocess("--input", write_jsonl(tmp_path / "s.jsonl", [{"text": SENTENCE}] * 40),
                      "--tokenizer-name-or-path", tok, "--output-prefix", tmp_path / "s", "--append-eod") == 0
    cfg = config({"dataPath": [str(tmp_path / "s")]}, trainIters=30) | {
        "optimizer": {"lr": 1e-2, "lrDecayStyle": "constant"}, "checkpoint": {"save": str(tmp_path / "ckpt")}}
    assert cfg["model"] == MODEL
    proc, steps = run_train(tmp_path, cfg, "--pipeline-model-parallel-size", "2")
    assert_ok(proc)
    assert steps[-1][2] < 0.5, f"did not memorise the sentence: {[s[2] for s in steps]}"

    def generate(*flags: str) -> str:
        cmd = [str(VENV_BIN / "torchrun"), "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
               str(free_port()), "-m", "ascend_engine.cli", "generate", "--device", "cpu", "--load",
               str(tmp_path / "ckpt"), "--tokenizer-name-or-path", str(tok), "--prompt", "The quick brown", *flags]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert_ok(proc)
        return proc.stdout.strip()

    cached = generate("--max-new-tokens", "12")
    assert cached.startswith(SENTENCE)
    assert generate("--max-new-tokens", "12", "--no-kv-cache") == cached
    sampled = generate("--max-new-tokens", "4", "--top-p", "0.9", "--temperature", "0.7")
    assert sampled.startswith("The quick brown") and len(sampled) > len("The quick brown"), sampled
