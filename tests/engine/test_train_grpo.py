"""The grpo stage on real prepared R1 prompt data: a tiny model learns a rule from rewards alone, TP=2 and PP=2
reproduce the single-process rollouts and losses, a resumed run continues exactly (same rollouts), and LoRA-GRPO
keeps its base bit-identical (the reference is the base with adapters off).

Data: ``ascend-engine preprocess`` with the R1AlpacaStyleInstructionHandler; the reward is the user function
``grpo_toy_reward:letter_share`` loaded by module path (share of the response's letters equal to the reference).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from float_bounds import assert_curves_agree, model_delta
from test_train_lora import FROZEN_CHECK
from test_train_torchrun import TINY, VENV_BIN, free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from prep_support import build_tokenizer, preprocess, write_jsonl  # noqa: E402

HERE = Path(__file__).resolve().parent
FIELDS = ("lm loss", "grpo/policy_loss", "grpo/kl", "grpo/clip_fraction", "grpo/entropy", "grpo/reward_mean",
          "grpo/reward_std", "grpo/accuracy", "grpo/response_length")
LINE = re.compile(r" iteration\s+(\d+)/.*?\| lm loss: (.*?) \| tokens/s")
QUESTIONS = [("the fox", "o"), ("the dog", "e"), ("quick brown", "o"), ("tips for health", "e"),
             ("sleep well", "e"), ("hold tokens", "o"), ("lazy dog", "o"), ("eat well", "e")]
MODEL = {**TINY["model"], "vocabSize": 400, "paddedVocabSize": 512}


def steps(stdout: str) -> list[dict[str, float]]:
    """The metrics of each logged step (every field of the log line after the iteration)."""
    out = []
    for m in LINE.finditer(stdout):
        fields = dict(part.split(": ", 1) for part in ("lm loss: " + m[2]).split(" | "))
        out.append({k: float(v) for k, v in fields.items() if k in FIELDS or "/" in k})
    return out


def run(tmp_path: Path, cfg: dict, *flags: str, nproc: int = 1, script: str | None = None):
    path = tmp_path / f"grpo-{nproc}-{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(
        [str(HERE), env.get("PYTHONPATH", "")]))
    if script:
        cmd = [sys.executable, "-c", script, str(path)]
    elif nproc == 1:
        cmd = [sys.executable, "-m", "ascend_engine.cli", "train", "--config", str(path), *flags]
    else:
        cmd = [str(VENV_BIN / "torchrun"), "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
               "--master-port", str(free_port()), "-m", "ascend_engine.cli", "train", "--config", str(path), *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("r1")
    tok = build_tokenizer(root / "tok")
    records = [{"instruction": q, "input": "", "output": a} for q, a in QUESTIONS]
    assert preprocess("--input", write_jsonl(root / "r1.jsonl", records), "--tokenizer-name-or-path", tok,
                      "--handler-name", "R1AlpacaStyleInstructionHandler", "--prompt-type", "empty",
                      "--output-prefix", root / "r1") == 0
    return root / "r1", tok


def grpo_config(prompts, **grpo) -> dict:
    prefix, tok = prompts
    return {**TINY, "model": MODEL, "stage": "grpo", "data": {"dataPath": [str(prefix)], "tokenizerNameOrPath": str(tok)},
            "training": {**TINY["training"], "microBatchSize": 1, "globalBatchSize": 2, "seqLength": 32,
                         "trainIters": 4},
            "optimizer": {"lr": 1e-2, "lrDecayStyle": "constant"},
            "grpo": {"nSamplesPerPrompt": 4, "maxNewTokens": 8,
                     "verifierFunction": ["grpo_toy_reward:letter_share"], **grpo}}


FULL = {"klCoef": 0.05, "policyUpdates": 2}  # reference model, rollout log-probs as old ones, the clip


@pytest.fixture(scope="module")
def straight(prompts, base, tmp_path_factory):
    """4 steps from the base with every part on (KL to the reference, two updates per rollout), saving at 2."""
    tmp = tmp_path_factory.mktemp("straight")
    cfg = {**grpo_config(prompts, **FULL), "checkpoint": {"load": str(base), "finetune": True,
                                                          "save": str(tmp / "ckpt"), "saveInterval": 2}}
    return cfg, tmp / "ckpt", steps(run(tmp, cfg).stdout)


@pytest.mark.engine
def test_grpo_step_reports_its_metrics(straight):
    _, _, logged = straight
    assert len(logged) == 4
    for s in logged:
        assert {"grpo/reward_mean", "grpo/accuracy", "grpo/kl", "grpo/clip_fraction", "grpo/entropy",
                "timing/rollout_s", "timing/update_s", "tokens_per_s/rollout", "tokens_per_s/update"} <= set(s)
        assert 0 < s["grpo/response_length"] <= 8 and 0 <= s["grpo/accuracy"] <= 1
        assert 0 < s["grpo/entropy"] <= np.log(400) + 1e-4
    assert all(s["grpo/kl"] >= 0 for s in logged) and logged[-1]["grpo/kl"] > 0  # the policy left the reference
    assert any(s["grpo/clip_fraction"] > 0 for s in logged)  # the second update of a rollout is clipped


@pytest.mark.engine
def test_grpo_resumes_exactly(tmp_path, straight, base):
    """Steps 3 and 4 again from the iteration-2 checkpoint (reference: the starting weights) repeat exactly."""
    cfg, ckpt, single = straight
    (ckpt / "latest_checkpointed_iteration.txt").write_text("2")  # back to the middle of the straight run
    resumed = {**cfg, "checkpoint": {"load": str(ckpt)}, "preference": {"refModel": str(base)}}
    ours = steps(run(tmp_path, resumed).stdout)
    assert len(ours) == 2
    for a, b in zip(single[2:], ours):
        assert {k: a[k] for k in FIELDS} == {k: b[k] for k in FIELDS}, (a, b)


@pytest.mark.engine
def test_lora_grpo_keeps_the_base(tmp_path, prompts, base):
    cfg = {**grpo_config(prompts, klCoef=0.05), "checkpoint": {"load": str(base)},
           "lora": {"loraR": 4, "loraAlpha": 8.0, "loraTargetModules": ["linear_qkv", "linear_fc2"]}}
    cfg["training"]["trainIters"] = 3
    proc = run(tmp_path, cfg, script=FROZEN_CHECK)
    assert "BASE_CHANGED []" in proc.stdout, proc.stdout
    logged = steps(proc.stdout)
    assert logged[0]["grpo/kl"] == 0.0 and any(s["grpo/kl"] > 0 for s in logged[1:]), logged


def learning_config(prompts, **training) -> dict:
    cfg = grpo_config(prompts, nSamplesPerPrompt=8, klCoef=0.01, policyUpdates=2)
    cfg["training"].update({"globalBatchSize": 4, "trainIters": 30, **training})
    return cfg


@pytest.fixture(scope="module")
def learning(prompts, tmp_path_factory) -> list[dict[str, float]]:
    """30 steps from random weights, one process."""
    return steps(run(tmp_path_factory.mktemp("learning"), learning_config(prompts)).stdout)


@pytest.mark.engine
def test_reward_rises_on_a_learnable_rule(learning):
    """The share of the reference letter in the responses grows clearly within 30 steps."""
    rewards = [s["grpo/reward_mean"] for s in learning]
    assert len(rewards) == 30
    first, last = np.mean(rewards[:5]), np.mean(rewards[-5:])
    assert last > first + 0.2 and last > 2 * first, rewards


@pytest.mark.engine
@pytest.mark.parametrize("flags", [["--tensor-model-parallel-size", "2"], ["--pipeline-model-parallel-size", "2"]],
                         ids=["tp2", "pp2"])
def test_grpo_layouts_match_single_process(tmp_path, prompts, learning, flags):
    """The first 2 steps of the learning run again at TP=2 / PP=2: the same rollouts, the same losses. These runs
    decode 5 of their 32 rollout rows at a time (``maxNumSeqs``: at TP2 a response that ends hands its cache slot
    to the next, at PP2 batches of 5), the learning run all 32 at once: the samples do not depend on it.

    Step 1 samples from identical weights; step 2 from weights both layouts updated. Further on, the rounding
    differences of TP's split reductions (~1e-7, amplified by lr 1e-2) eventually flip a sample that sits on a
    threshold of the sampler, so longer runs agree statistically, not token for token.

    The rollout's log-probabilities (the "old" ones of the clip) come from inference's kernels, within tolerance
    parity (~1e-6) of the training forward's, and differ in those last bits between layouts (TP1's decode step
    against TP2's sharded products and PP2's layered loop): a token whose probability ratio sits on the clip's
    boundary may then count on either side, so the clip fraction may differ by one token of one update.

    The loss, KL and entropy agree within float32's rounding (tests/float_bounds.py: delta = 5.4e-6 for this model,
    K the padded vocabulary of 512) of what they are computed from: the loss is a mean over the rows' tokens of
    advantage-weighted probability ratios exp(logp - logp_old), near zero (the advantages cancel within a group) but
    each term's rounding that of two log-probabilities of about ln 512, with advantages of size 1 on average, and
    independent terms averaging as a random walk: 2 ln 512 / sqrt(32 rows) = 2.2 (1.2e-5 of bound; the former 1e-6
    + 1e-4 of a loss near zero was about 1e-6, a floor unrelated to these sizes; a wrong log-probability gather
    moves the loss by a share of the advantages, ~1e-1); the KL estimator exp(r) - r - 1 of r = logp_ref - logp
    moves by |r| ~ sqrt(2 KL) times r's rounding of 2 ln 512 delta; the entropy is its own size. Plus the way each
    travelled and the log line's last digit. Measured with AVX-512 and AVX2 kernels: at most 0.03 of the bound
    (the entropy's last printed digit)."""
    cfg = learning_config(prompts, trainIters=2)
    ours = steps(run(tmp_path, cfg, *flags, "--max-num-seqs", "5", nproc=2).stdout)
    assert len(ours) == 2
    d, log_v = model_delta(MODEL, cfg["training"]["seqLength"]), np.log(MODEL["paddedVocabSize"])
    reference = learning[:2]
    kl_size = 2 * log_v * np.sqrt(2 * max(s["grpo/kl"] for s in reference))
    rows_per_step = cfg["training"]["globalBatchSize"] * cfg["grpo"]["nSamplesPerPrompt"]
    used = {key: assert_curves_agree([a[key] for a in reference], [b[key] for b in ours], d, f"{flags} {key}", scale,
                                     from_log=True)
            for key, scale in (("lm loss", 2 * log_v / np.sqrt(rows_per_step)), ("grpo/kl", kl_size),
                               ("grpo/entropy", 0.0))}
    print(f"{flags}: share of the float32 bound used {used}")
    rows = cfg["training"]["globalBatchSize"] * cfg["grpo"]["nSamplesPerPrompt"] * cfg["grpo"]["policyUpdates"]
    for i, (a, b) in enumerate(zip(learning, ours), start=1):
        for key in ("grpo/reward_mean", "grpo/response_length", "grpo/accuracy"):  # the same rollouts
            assert a[key] == b[key], f"iteration {i} {key}: {a[key]} vs {b[key]}"
        one_token = 1 / (a["grpo/response_length"] * rows)
        assert abs(b["grpo/clip_fraction"] - a["grpo/clip_fraction"]) <= one_token + 1e-6, (i, a, b)
        if b["grpo/clip_fraction"] != a["grpo/clip_fraction"]:
            print(f"iteration {i}: a token on the clip's boundary ({a['grpo/clip_fraction']} vs "
                  f"{b['grpo/clip_fraction']})")
