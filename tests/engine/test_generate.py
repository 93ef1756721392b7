"""`ascend-engine generate`: a model trained (PP=2) to memorise a sentence continues its prompt with it."""
from __future__ import annotations

import os
import subprocess

import pytest

from memorised import SENTENCE, SENTENCE_PROMPT
from test_train_torchrun import VENV_BIN, assert_ok, free_port


@pytest.mark.engine
def test_greedy_generation_reproduces_a_memorised_sentence(memorised):
    assert memorised["losses"][-1] < 0.5, f"did not memorise its set: {memorised['losses']}"

    def generate(*flags: str) -> str:
        cmd = [str(VENV_BIN / "torchrun"), "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
               str(free_port()), "-m", "ascend_engine.cli", "generate", "--device", "cpu", "--load",
               str(memorised["checkpoint"]), "--tokenizer-name-or-path", str(memorised["tokenizer"]),
               "--prompt", SENTENCE_PROMPT, *flags]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert_ok(proc)
        return proc.stdout.strip()

    cached = generate("--max-new-tokens", "12")
    assert cached.startswith(SENTENCE)
    sampled = generate("--max-new-tokens", "4", "--top-p", "0.9", "--temperature", "0.7")
    assert sampled.startswith(SENTENCE_PROMPT) and len(sampled) > len(SENTENCE_PROMPT), sampled
