"""LoRA: only the adapters train and are saved, the base stays bit-identical, TP shards the adapters like their
layers, resuming with --lora-load continues exactly, and `ascend-engine convert` merges the saved adapter."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import yaml

from float_bounds import assert_curves_agree, delta, forward_atol, model_delta
from test_train_data import run_single
from test_train_torchrun import LINE, TINY, assert_ok, run_train

TARGETS = ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
R, ALPHA = 4, 8.0
BASE = {**TINY, "model": {**TINY["model"], "paddedVocabSize": 128},
        "training": {**TINY["training"], "trainIters": 2}}

# The real Trainer in one process: snapshot the base before training, compare after, bit for bit.
FROZEN_CHECK = textwrap.dedent("""
    import sys, yaml, torch
    from ascend_engine.config.train import TrainConfig
    from ascend_engine.device import select_backend
    from ascend_engine.models.lora import is_adapter_key
    from ascend_engine.models.wrappers import unwrap
    from ascend_engine.train.loop import Trainer
    trainer = Trainer(TrainConfig.model_validate(yaml.safe_load(open(sys.argv[1]))), select_backend("cpu"))
    params = dict(unwrap(trainer.model).named_parameters())
    before = {k: p.detach().clone() for k, p in params.items()}
    trainer.run()
    changed = sorted(k for k, p in params.items() if not torch.equal(p.detach(), before[k]))
    trainable = sorted(k for k, p in params.items() if p.requires_grad)
    print("CHANGED", len(changed), "ADAPTER", sum(map(is_adapter_key, params)), "TRAINABLE", len(trainable))
    print("BASE_CHANGED", [k for k in changed if not is_adapter_key(k)])
    print("FROZEN_ADAPTER", [k for k in params if is_adapter_key(k) and k not in trainable])
""")


@pytest.mark.engine
def test_lora_trains_only_adapters_shards_resumes_and_merges(tmp_path):
    base = tmp_path / "base"
    assert run_single(tmp_path, {**BASE, "checkpoint": {"save": str(base)}})[0]
    lora = {**BASE, "training": {**BASE["training"], "trainIters": 10}, "optimizer": {"lr": 1e-2, "lrDecayStyle": "constant"},
            "checkpoint": {"load": str(base)},
            "lora": {"loraR": R, "loraAlpha": ALPHA, "loraTargetModules": TARGETS}}

    # 10 steps straight in one process: the base is bit-identical afterwards, every adapter changed. It saves
    # its adapter at 5 and 10; the one at 5 is what a resume must continue from (--exit-interval's stop-and-save
    # is checked in test_train_data).
    straight_dir = tmp_path / "straight"
    path = tmp_path / "straight.yaml"
    path.write_text(yaml.safe_dump({**lora, "checkpoint": {**lora["checkpoint"], "save": str(straight_dir),
                                                            "saveInterval": 5}}))
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")}
    proc = subprocess.run([sys.executable, "-c", FROZEN_CHECK, str(path)], capture_output=True, text=True,
                          timeout=120, env={**env, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "BASE_CHANGED []" in proc.stdout and "FROZEN_ADAPTER []" in proc.stdout, proc.stdout
    adapters = 2 * len(TARGETS) * BASE["model"]["numLayers"]
    assert f"CHANGED {adapters} ADAPTER {adapters} TRAINABLE {adapters}" in proc.stdout, proc.stdout
    straight = [float(m[4]) for m in LINE.finditer(proc.stdout)]
    assert len(straight) == 10 and straight[-1] < 0.95 * straight[0], straight  # r=4 adapters learn slowly

    # 5 + --lora-load + 5: the adapter checkpoint alone (with the base from --load) continues exactly.
    adapter_dir = tmp_path / "adapter"
    shutil.copytree(straight_dir / "iter_0000005", adapter_dir / "iter_0000005")
    (adapter_dir / "latest_checkpointed_iteration.txt").write_text("5\n")
    state = torch.load(adapter_dir / "iter_0000005/mp_rank_00/model_optim_rng.pt", weights_only=False)
    assert len(state["model"]) == adapters and all(".lora_" in k for k in state["model"]), list(state["model"])
    assert state["args"].lora_r == R and state["args"].lora_target_modules == TARGETS
    resumed = {**lora, "checkpoint": {**lora["checkpoint"], "save": str(adapter_dir)}}
    second, out = run_single(tmp_path, {**resumed, "lora": {**lora["lora"], "loraLoad": str(adapter_dir)}})
    assert "LoRA adapters" in out
    np.testing.assert_allclose(second, straight[5:], rtol=1e-5)

    # TP=2: A or B split like the layer, the same model, the same losses; the TP=2 adapter merges into the
    # TP=1 base as W + (alpha / r) B A.
    from ascend_engine.cli import main

    base_tp2, tp_dir = tmp_path / "base_tp2", tmp_path / "tp2"
    assert main(["convert", "--load-model-type", "mg", "--save-model-type", "mg", "--load-dir", str(base),
                 "--save-dir", str(base_tp2), "--target-tensor-parallel-size", "2"]) == 0
    proc, steps = run_train(tmp_path, {**lora, "training": {**lora["training"], "trainIters": 4},
                                       "checkpoint": {"load": str(base_tp2), "save": str(tp_dir)}},
                            "--tensor-model-parallel-size", "2", name="tp2.yaml")
    assert_ok(proc)
    # the same training in another order of sums: within float32's rounding over the way the loss travelled
    # (tests/float_bounds.py: sqrt(K = 256) x (2 layers + 2) x 2**-24 = 3.8e-6 of it, 1.9e-5 for these losses of about
    # 4.9 that fall slowly, and the log line's last digit; the former 1e-4 of the loss, 4.9e-4, was 25x wider)
    used = assert_curves_agree(straight[:4], [s[2] for s in steps], model_delta(BASE["model"], 32), "LoRA at TP=2",
                               from_log=True)
    print(f"LoRA TP=2: {used:.2f} of the float32 bound used")

    merged = tmp_path / "merged"
    assert main(["convert", "--load-model-type", "mg", "--save-model-type", "mg", "--load-dir", str(base),
                 "--save-dir", str(merged), "--lora-load", str(tp_dir), "--lora-r", str(R), "--lora-alpha",
                 str(ALPHA), "--lora-target-modules", *TARGETS]) == 0
    latest = lambda root: torch.load(next(root.glob("*/mp_rank_00/model_optim_rng.pt")),  # noqa: E731
                                     weights_only=False)["model"]
    w0, w1 = latest(base), latest(merged)
    shards = [torch.load(tp_dir / f"iter_0000004/mp_rank_0{r}/model_optim_rng.pt", weights_only=False)["model"]
              for r in range(2)]
    for layer in range(BASE["model"]["numLayers"]):
        for module in ("self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2"):
            key = f"decoder.layers.{layer}.{module}"
            a = [s[f"{key}.lora_A.default.weight"] for s in shards]
            b = [s[f"{key}.lora_B.default.weight"] for s in shards]
            if module.endswith(("linear_qkv", "linear_fc1")):
                torch.testing.assert_close(a[0], a[1], rtol=0, atol=0)  # replicated
                if module.endswith("fc1"):  # [gate_i; up_i] per rank
                    g, u = zip(*(x.chunk(2) for x in b))
                    b_full = torch.cat([*g, *u])
                else:
                    b_full = torch.cat(b)
                a_full = a[0]
            else:
                torch.testing.assert_close(b[0], b[1], rtol=0, atol=0)
                a_full, b_full = torch.cat(a, dim=1), b[0]
            assert b_full.abs().max() > 0, f"{key}: B never trained"
            expected = w0[f"{key}.weight"].float() + ALPHA / R * (b_full.float() @ a_full.float())
            # a product over the rank (R terms), a scaling and an addition, in float32 both ways: sqrt(R) x 3 x
            # 2**-24 of the largest weight (the former 1e-5 of each weight + 1e-6 was about 20-50x that)
            atol = forward_atol(expected, delta(R, 3))
            torch.testing.assert_close(w1[f"{key}.weight"].float(), expected, rtol=0, atol=atol, msg=key)
    for key in ("embedding.word_embeddings.weight", "decoder.final_layernorm.weight", "output_layer.weight"):
        assert torch.equal(w1[key], w0[key]), key
