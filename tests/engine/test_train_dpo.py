"""Preference stages (dpo, simpo) on real prepared pairwise data: the DPO loss starts at ln 2 with policy ==
reference, TP=2 / PP=2 / DP=2 reproduce the single-process loss curve, chosen replies become preferred, LoRA-DPO
keeps its base bit-identical (the reference is the base itself), and a resumed DPO run continues exactly.

The data is prepared with the real ``ascend-engine preprocess`` and AlpacaStylePairwiseHandler; the model is
the tiny 2-layer GPT of the other engine tests.

The layouts agree within float32's rounding (tests/float_bounds.py). The loss and the rewards are functions of
beta x (policy - reference) log-probability sums over the replies, so their rounding is that of the sums, not of
the small differences logged: delta (5.4e-6 for this model, K the padded vocabulary of 512) times beta x the size
of a pair's four sums (chosen and rejected, policy and reference, at most 14 reply tokens each:
sqrt(56) x ln 512 = 47, so 4.7 at beta 0.1), plus delta of the value and of the way it travelled, plus the log
line's last digit: 2.5e-5 to 3.2e-5 a step. The former allowances were 1e-5 of the loss (4.4e-6 to 6.9e-6: the
new bound is 4-7x wider, because a loss of 0.5 is computed from log-probability sums of about 50) and 1e-3 of each
reward plus 1e-6 (1.2e-4 to 3.3e-4 after the first step, where every reward is exactly 0: 4-12x tighter).
Measured with AVX-512 and AVX2 kernels: at most 6e-7 on the loss and 2e-6 on a reward (TP=2), under 0.08 of the
bound, thousands of times below the rewards (0.12-0.64) that a wrong shard or a mismatched pair would move.
"""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from float_bounds import assert_curves_agree, logprob_scale, model_delta
from test_train_data import run_single
from test_train_lora import FROZEN_CHECK
from test_train_torchrun import TINY, assert_ok, run_train

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from prep_support import build_tokenizer, preprocess, write_jsonl  # noqa: E402

METRICS = re.compile(r"\| lm loss: (\S+) \| rewards/chosen: (\S+) \| rewards/rejected: (\S+) \| "
                     r"rewards/margins: (\S+) \| rewards/accuracies: (\S+) \|")
PAIRS = [("The quick brown fox?", "jumps over the lazy dog.", "Eat well, sleep, exercise."),
         ("Give three tips.", "Eat well, sleep, exercise.", "tool response input"),
         ("Megatron indexed datasets?", "hold tokens back to back.", "The quick brown fox."),
         ("user assistant system", "tool response input", "hold tokens back to back.")]
MODEL = {**TINY["model"], "vocabSize": 400, "paddedVocabSize": 512}
REPLY_TOKENS = 14  # the longest reply of PAIRS in the prepared data (labels that count)


def metrics(stdout: str) -> list[tuple[float, ...]]:
    """(loss, rewards/chosen, rewards/rejected, margin, accuracy) per logged step."""
    return [tuple(map(float, m)) for m in METRICS.findall(stdout)]


def dpo_config(prefix: Path, stage: str = "dpo", **training) -> dict:
    return {**TINY, "model": MODEL, "stage": stage,
            "data": {"dataPath": [str(prefix)], "isPairwiseDataset": True},
            "training": {**TINY["training"], "microBatchSize": 1, "globalBatchSize": 4, "seqLength": 64,
                         "trainIters": 4, **training},
            "optimizer": {"lr": 3e-3, "lrDecayStyle": "constant"}}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pairs")
    tok = build_tokenizer(root / "tok")
    records = [{"instruction": q, "input": "", "chosen": c, "rejected": r} for q, c, r in PAIRS]
    assert preprocess("--input", write_jsonl(root / "pairs.jsonl", records), "--tokenizer-name-or-path", tok,
                      "--handler-name", "AlpacaStylePairwiseHandler", "--prompt-type", "qwen",
                      "--output-prefix", root / "pairs") == 0
    return root / "pairs"


@pytest.fixture(scope="module")
def single(pairs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("single")
    proc, _ = run_train(tmp, dpo_config(pairs), nproc=1)
    assert_ok(proc)
    return metrics(proc.stdout)


@pytest.mark.engine
def test_dpo_starts_at_ln2_with_zero_margin(single):
    loss, chosen, rejected, margin, accuracy = single[0]
    assert abs(loss - math.log(2)) < 1e-6, loss
    assert chosen == rejected == margin == accuracy == 0.0
    assert len(single) == 4 and single[-1][0] < single[0][0], single


@pytest.mark.engine
@pytest.mark.parametrize("flags", [["--tensor-model-parallel-size", "2"], ["--pipeline-model-parallel-size", "2"],
                                   ["--use-distributed-optimizer"]], ids=["tp2", "pp2", "dp2"])
def test_dpo_layouts_match_single_process(tmp_path, pairs, single, flags):
    proc, _ = run_train(tmp_path, dpo_config(pairs), *flags)
    assert_ok(proc)
    ours = metrics(proc.stdout)
    assert len(ours) == len(single) == 4
    d = model_delta(MODEL, 64)
    sums = 0.1 * logprob_scale(4 * REPLY_TOKENS, MODEL["paddedVocabSize"])  # beta x a pair's four sums
    used = {name: assert_curves_agree([a[k] for a in single], [b[k] for b in ours], d, f"{flags} {name}", sums,
                                      from_log=True)
            for k, name in enumerate(("loss", "rewards/chosen", "rewards/rejected", "rewards/margins"))}
    print(f"{flags}: share of the float32 bound used {used}")
    assert [a[4] for a in single] == [b[4] for b in ours]  # accuracies: a pair's sign flips only at a tie


@pytest.mark.engine
@pytest.mark.parametrize("stage", ["dpo", "simpo"])
def test_chosen_replies_become_preferred(tmp_path, pairs, stage):
    _, out = run_single(tmp_path, dpo_config(pairs, stage, trainIters=12))
    steps = metrics(out)
    assert len(steps) == 12
    margins = [s[3] for s in steps]
    assert steps[-1][4] == 1.0, steps
    assert margins[-1] > margins[0] + 0.5, margins


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A starting checkpoint (one pretraining step on synthetic tokens) for LoRA and for the reference."""
    tmp = tmp_path_factory.mktemp("base")
    warm = {**TINY, "model": MODEL, "training": {**TINY["training"], "trainIters": 1},
            "checkpoint": {"save": str(tmp / "ckpt")}}
    assert run_single(tmp, warm)[0]
    return tmp / "ckpt"


def run_process(tmp_path: Path, cfg: dict, *argv: str) -> subprocess.CompletedProcess:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")}
    return subprocess.run([sys.executable, *argv, str(path)], capture_output=True, text=True, timeout=120,
                          env={**env, "OMP_NUM_THREADS": "1"})


@pytest.mark.engine
def test_lora_dpo_reference_is_the_untouched_base(tmp_path, pairs, base):
    """The reference is the base with adapters off, so the first loss is ln 2; training moves only the adapters."""
    lora = {**dpo_config(pairs, trainIters=6), "checkpoint": {"load": str(base)},
            "optimizer": {"lr": 1e-2, "lrDecayStyle": "constant"},
            "lora": {"loraR": 4, "loraAlpha": 8.0, "loraTargetModules": ["linear_qkv", "linear_fc2"]}}
    proc = run_process(tmp_path, lora, "-c", FROZEN_CHECK)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "BASE_CHANGED []" in proc.stdout, proc.stdout
    steps = metrics(proc.stdout)
    assert abs(steps[0][0] - math.log(2)) < 1e-6 and steps[0][3] == 0.0, steps
    assert steps[-1][3] > 0 and steps[-1][0] < steps[0][0], steps  # adapters moved the policy off the base


@pytest.mark.engine
def test_dpo_resumes_exactly_with_its_reference(tmp_path, pairs, base):
    """4 steps straight (saving at 2 and 4), then again from the iteration-2 checkpoint with refModel = the
    starting weights: steps 3 and 4 repeat. Without refModel the resumed run would take the trained policy as
    its reference; it is refused instead."""
    ckpt = tmp_path / "dpo"
    straight = {**dpo_config(pairs, trainIters=4),
                "checkpoint": {"load": str(base), "finetune": True, "save": str(ckpt), "saveInterval": 2}}
    _, out = run_single(tmp_path, straight)
    losses = [s[0] for s in metrics(out)]
    (ckpt / "latest_checkpointed_iteration.txt").write_text("2")
    resumed = {**straight, "checkpoint": {"load": str(ckpt)}}
    _, out = run_single(tmp_path, {**resumed, "preference": {"refModel": str(base)}})
    assert "loaded checkpoint" in out
    np.testing.assert_allclose([s[0] for s in metrics(out)], losses[2:], rtol=1e-6)

    proc = run_process(tmp_path, resumed, "-m", "ascend_engine.cli", "train", "--config")
    assert proc.returncode == 2  # an invalid config, said in one message, no traceback
    assert "Traceback" not in proc.stderr and "preference.refModel" in proc.stderr and "trained policy" in proc.stderr, proc.stderr[-2000:]
