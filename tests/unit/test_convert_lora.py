"""LoRA merge: W' = W + (alpha / r) * B @ A, from an adapter saved with its own TP layout, to mg or hf."""
from __future__ import annotations

import copy

import pytest
import torch

from ascend_engine.cli import main
from float_bounds import delta, forward_atol
from test_convert_models import make_hf_model
from test_convert_roundtrip import hf_tensors, mg_states

R, ALPHA, LAYERS = 4, 8.0, 4
# module -> (out, in) of the whole Megatron weight for the qwen3 test model (hidden 64, 4 heads, 2 groups, dim 32)
SHAPES = {"self_attention.linear_qkv": (256, 64), "self_attention.linear_proj": (64, 128),
          "mlp.linear_fc1": (192, 64), "mlp.linear_fc2": (64, 96)}


def shard_adapter(module: str, a: torch.Tensor, b: torch.Tensor, rank: int, tp: int):
    """What a TP rank of a PEFT-wrapped Megatron layer holds, written out by hand."""
    if module.endswith("linear_fc1"):
        gate, up = b.chunk(2)
        return a, torch.cat([gate.chunk(tp)[rank], up.chunk(tp)[rank]])
    if module.endswith("linear_qkv"):
        return a, b.chunk(tp)[rank]
    return a.chunk(tp, dim=1)[rank], b  # row parallel


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    make_hf_model("qwen3", root / "hf")
    assert main(["convert", "--load-dir", str(root / "hf"), "--save-dir", str(root / "base")]) == 0
    base = mg_states(root / "base")["mp_rank_00"]
    torch.manual_seed(3)
    full = {f"decoder.layers.{i}.{m}": (torch.randn(R, shape[1]), torch.randn(shape[0], R) * 0.1)
            for i in range(LAYERS) for m, shape in SHAPES.items()}
    tp = 2
    args = copy.copy(base["args"])
    args.tensor_model_parallel_size = tp
    for rank in range(tp):
        state = {}
        for module, (a, b) in full.items():
            a_r, b_r = shard_adapter(module, a, b, rank, tp)
            state[f"{module}.lora_A.default.weight"] = a_r.clone()
            state[f"{module}.lora_B.default.weight"] = b_r.clone()
        folder = root / "adapter" / "iter_0000020" / f"mp_rank_{rank:02d}"
        folder.mkdir(parents=True)
        torch.save({"model": state, "args": args, "checkpoint_version": 3.0, "iteration": 20},
                   folder / "model_optim_rng.pt")
    (root / "adapter" / "latest_checkpointed_iteration.txt").write_text("20")
    return root, base, full


LORA_FLAGS = ["--lora-r", str(R), "--lora-alpha", str(ALPHA), "--lora-target-modules", "linear_qkv", "linear_proj",
              "linear_fc1", "linear_fc2"]


def test_merged_weight_is_w_plus_scaled_ba(setup, tmp_path):
    root, base, full = setup
    assert main(["convert", "--load-model-type", "mg", "--save-model-type", "mg", "--load-dir", str(root / "base"),
                 "--lora-load", str(root / "adapter"), "--save-dir", str(tmp_path / "merged"), *LORA_FLAGS]) == 0
    merged = mg_states(tmp_path / "merged")["mp_rank_00"]["model"]
    for module, (a, b) in full.items():
        expected = base["model"][f"{module}.weight"] + (ALPHA / R) * (b @ a)
        # a product over the rank (R terms), a scaling and an addition, float32 both ways: within sqrt(R) x 3 x
        # 2**-24 of the largest weight (tests/float_bounds.py); the former fixed 1e-6 does not scale with them
        atol = forward_atol(expected, delta(R, 3))
        assert torch.allclose(merged[f"{module}.weight"], expected, atol=atol, rtol=0), module
        assert not torch.allclose(merged[f"{module}.weight"], base["model"][f"{module}.weight"], atol=1e-3)
    for key in ("decoder.layers.0.input_layernorm.weight", "embedding.word_embeddings.weight",
                "decoder.layers.3.self_attention.q_layernorm.weight"):
        assert torch.equal(merged[key], base["model"][key])
    # to HF directly gives the same tensors as merging in Megatron form and exporting that
    assert main(["convert", "--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", str(root / "base"),
                 "--lora-load", str(root / "adapter"), "--save-dir", str(tmp_path / "hf"), "--model-type-hf",
                 "qwen3", *LORA_FLAGS]) == 0
    assert main(["convert", "--load-model-type", "mg", "--save-model-type", "hf", "--load-dir",
                 str(tmp_path / "merged"), "--save-dir", str(tmp_path / "hf2"), "--model-type-hf", "qwen3"]) == 0
    direct, via = hf_tensors(tmp_path / "hf"), hf_tensors(tmp_path / "hf2")
    assert sorted(direct) == sorted(via) and all(torch.equal(direct[k], via[k]) for k in direct)


@pytest.mark.parametrize("flags,message", [
    (["--lora-r", "8", "--lora-alpha", "16", "--lora-target-modules", "linear_qkv", "linear_proj", "linear_fc1",
      "linear_fc2"], "has rank 4"),
    (["--lora-r", "4", "--lora-alpha", "8", "--lora-target-modules", "linear_qkv", "linear_proj"],
     "adapter targets ['linear_fc1', 'linear_fc2', 'linear_proj', 'linear_qkv']"),
])
def test_mismatched_adapter_is_refused(setup, tmp_path, capsys, flags, message):
    root, _, _ = setup
    rc = main(["convert", "--load-model-type", "mg", "--save-model-type", "mg", "--load-dir", str(root / "base"),
               "--lora-load", str(root / "adapter"), "--save-dir", str(tmp_path / "out"), *flags])
    assert rc == 1 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
