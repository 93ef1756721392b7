"""Preference stages (dpo, simpo) on real prepared pairwise data: the DPO loss starts at ln 2 with policy ==
reference, TP=2 / PP=2 / DP=2 reproduce the single-process loss curve, chosen replies become preferred, LoRA-DPO
keeps its base bit-identical (the reference is the base itself), and a resumed DPO run continues exactly.

The data is prepared with the real ``ascend-engine preprocess`` and AlpacaStylePairwiseHandler; the model is
the tiny 2-layer GPT of the other engine tests.
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
TOLERANCE = 1e-5


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
    for i, (a, b) in enumerate(zip(single, ours), start=1):
        assert abs(a[0] - b[0]) <= TOLERANCE * abs(a[0]), f"iteration {i}: loss {a[0]} vs {b[0]}"
        np.testing.assert_allclose(b[1:4], a[1:4], rtol=1e-3, atol=1e-6, err_msg=f"iteration {i} rewards")


@pytest.mark.engine
@pytest.mark.parametrize("stage", ["dpo", "simpo"])
def test_chosen_replies_become_preferred(tmp_path, pairs, stage):
    _, out = run_single(tmp_path, dpo_config(pairs, stage, trainIters=12))
    steps = metrics(out)
    assert len(steps) == 12
    margins = [s[3] for s in steps]
    assert steps[-1][4] == 1.0, steps
    assert margins[-1] > margins[0] + 0.5, margins


@pytest.mark.engine
def test_lora_dpo_keeps_the_base_and_resumes_exactly(tmp_path, pairs):
    """LoRA-DPO: the reference is the base (adapters off), so the first loss is ln 2; the base stays bit-identical.
    Full DPO resumed from its checkpoint with refModel = the starting weights continues the straight run."""
    base = tmp_path / "base"
    warm = {**TINY, "model": MODEL, "training": {**TINY["training"], "trainIters": 1},
            "checkpoint": {"save": str(base)}}
    assert run_single(tmp_path, warm)[0]

    lora = {**dpo_config(pairs, trainIters=6), "checkpoint": {"load": str(base)},
            "optimizer": {"lr": 1e-2, "lrDecayStyle": "constant"},
            "lora": {"loraR": 4, "loraAlpha": 8.0, "loraTargetModules": ["linear_qkv", "linear_fc2"]}}
    path = tmp_path / "lora.yaml"
    path.write_text(yaml.safe_dump(lora))
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")}
    proc = subprocess.run([sys.executable, "-c", FROZEN_CHECK, str(path)], capture_output=True, text=True,
                          timeout=120, env={**env, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "BASE_CHANGED []" in proc.stdout, proc.stdout
    steps = metrics(proc.stdout)
    assert abs(steps[0][0] - math.log(2)) < 1e-6 and steps[0][3] == 0.0, steps
    assert steps[-1][3] > 0 and steps[-1][0] < steps[0][0], steps  # adapters moved the policy off the base

    full = {**dpo_config(pairs, trainIters=4), "checkpoint": {"load": str(base), "finetune": True}}
    _, out = run_single(tmp_path, full)
    straight = metrics(out)
    ckpt = tmp_path / "dpo"
    first, _ = run_single(tmp_path, {**full, "checkpoint": {**full["checkpoint"], "save": str(ckpt)}},
                          "--exit-interval", "2")
    resumed = {**full, "checkpoint": {"load": str(ckpt), "save": str(ckpt)},
               "preference": {"refModel": str(base)}}
    _, out = run_single(tmp_path, resumed)
    assert "loaded checkpoint" in out
    np.testing.assert_allclose([s[0] for s in metrics(out)], [s[0] for s in straight[2:]], rtol=1e-6)


@pytest.mark.engine
def test_resuming_dpo_without_ref_model_is_refused(tmp_path, pairs):
    ckpt = tmp_path / "dpo"
    cfg = {**dpo_config(pairs, trainIters=2), "checkpoint": {"save": str(ckpt)}}
    run_single(tmp_path, cfg, "--exit-interval", "1")
    path = tmp_path / "again.yaml"
    path.write_text(yaml.safe_dump({**cfg, "checkpoint": {"load": str(ckpt), "save": str(ckpt)}}))
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")}
    proc = subprocess.run([sys.executable, "-m", "ascend_engine.cli", "train", "--config", str(path)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode != 0
    assert "preference.refModel" in proc.stderr and "trained policy" in proc.stderr
