"""Mixture-of-experts conversion: HF config translation, Megatron's expert-parallel file layout, bit-identical
hf -> mg -> hf and mg -> mg round trips with experts split over EP ranks, and clear errors."""
from __future__ import annotations

import json

import pytest
import torch

from ascend_engine.cli import main
from test_convert_models import MOE_FAMILY_CONFIGS, make_hf_model
from test_convert_roundtrip import convert, hf_tensors, mg_states

MOE_LAYOUTS = [(2, 1, 2), (1, 2, 2), (2, 2, 4)]  # (tp, pp, ep)


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_moe")
    for family in MOE_FAMILY_CONFIGS:
        make_hf_model(family, root / family)
    return root


@pytest.mark.parametrize("family", sorted(MOE_FAMILY_CONFIGS))
def test_moe_config_translation(moe_models, family):
    from ascend_engine.convert.hf_config import family_for, hf_config_from_model, model_config_from_hf

    hf = json.loads((moe_models / family / "config.json").read_text())
    model = model_config_from_hf(hf, "config.json")
    spec = MOE_FAMILY_CONFIGS[family]
    assert model.numExperts == 4 and model.moeRouterTopk == 2
    assert model.moe_ffn_hidden_size == spec.get("moe_intermediate_size", spec["intermediate_size"])
    assert model.moeRouterPreSoftmax == (family == "qwen2_moe")  # qwen2_moe here does not renormalise top-k
    assert (model.moeSharedExpertIntermediateSize, model.moeSharedExpertGate) == (
        (48, True) if family == "qwen2_moe" else (None, False))
    assert model.qkLayernorm == (family == "qwen3_moe") and model.addQkvBias == (family == "qwen2_moe")
    again = hf_config_from_model(model, family_for(hf, None, "config.json"), "float32")
    assert model_config_from_hf(again, "generated") == model


@pytest.mark.parametrize("family", sorted(MOE_FAMILY_CONFIGS))
@pytest.mark.parametrize("tp,pp,ep", MOE_LAYOUTS)
def test_moe_hf_mg_hf_is_bit_identical(moe_models, tmp_path, family, tp, pp, ep):
    src = moe_models / family
    convert("--load-dir", src, "--save-dir", tmp_path / "mg", "--target-tensor-parallel-size", tp,
            "--target-pipeline-parallel-size", pp, "--target-expert-parallel-size", ep)
    states = mg_states(tmp_path / "mg")
    # Megatron-LM's names: mp_rank_TT, then _PPP when PP > 1, then _EEE when EP > 1
    assert set(states) == {f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else "") + f"_{e:03d}"
                           for t in range(tp) for p in range(pp) for e in range(ep)}
    for state in states.values():
        assert state["args"].expert_model_parallel_size == ep and state["args"].num_experts == 4
        experts = {k.split(".local_experts.")[1].split(".")[0] for k in state["model"] if ".local_experts." in k}
        assert experts == {str(j) for j in range(4 // ep)}
    convert("--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", tmp_path / "mg", "--save-dir",
            tmp_path / "hf", "--model-type-hf", family)
    before, after = hf_tensors(src), hf_tensors(tmp_path / "hf")
    assert sorted(before) == sorted(after)
    for name in before:
        assert before[name].dtype == after[name].dtype and torch.equal(before[name], after[name]), name
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == json.loads((src / "config.json").read_text())["architectures"]


def test_expert_parallel_ranks_hold_their_experts(moe_models, tmp_path):
    """EP2 at TP2: EP rank 1 holds global experts 2, 3 as local 0, 1, each TP-split as [gate_i; up_i]; dense
    tensors are the same in every EP rank's file."""
    src = moe_models / "qwen3_moe"
    convert("--load-dir", src, "--save-dir", tmp_path, "--target-tensor-parallel-size", 2,
            "--target-expert-parallel-size", 2)
    hf = hf_tensors(src)
    states = mg_states(tmp_path)
    rank = states["mp_rank_01_001"]["model"]  # TP rank 1, EP rank 1
    fc1 = rank["decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight"]
    gate, up = (hf[f"model.layers.1.mlp.experts.2.{n}_proj.weight"] for n in ("gate", "up"))
    assert torch.equal(fc1, torch.cat([gate[16:], up[16:]]))
    fc2 = rank["decoder.layers.1.mlp.experts.local_experts.1.linear_fc2.weight"]
    assert torch.equal(fc2, hf["model.layers.1.mlp.experts.3.down_proj.weight"][:, 16:])
    assert torch.equal(rank["decoder.layers.0.mlp.router.weight"], hf["model.layers.0.mlp.gate.weight"])
    other = states["mp_rank_01_000"]["model"]
    for key in ("decoder.layers.0.mlp.router.weight", "decoder.layers.0.self_attention.linear_qkv.weight"):
        assert torch.equal(rank[key], other[key])


def test_moe_mg_mg_reshard_is_bit_identical(moe_models, tmp_path):
    """EP1 -> TP2 PP2 EP2 -> EP4 -> EP1 gives back the same tensors (qwen2_moe: shared expert and its gate)."""
    convert("--load-dir", moe_models / "qwen2_moe", "--save-dir", tmp_path / "a")
    convert("--load-model-type", "mg", "--load-dir", tmp_path / "a", "--save-dir", tmp_path / "b",
            "--target-tensor-parallel-size", 2, "--target-pipeline-parallel-size", 2, "--target-expert-parallel-size", 2)
    convert("--load-model-type", "mg", "--load-dir", tmp_path / "b", "--save-dir", tmp_path / "c",
            "--target-expert-parallel-size", 4)
    assert sorted(mg_states(tmp_path / "c")) == [f"mp_rank_00_{e:03d}" for e in range(4)]
    convert("--load-model-type", "mg", "--load-dir", tmp_path / "c", "--save-dir", tmp_path / "d")
    a, d = mg_states(tmp_path / "a")["mp_rank_00"], mg_states(tmp_path / "d")["mp_rank_00"]
    assert list(a["model"]) == list(d["model"])
    for key, value in a["model"].items():
        assert (value is None and d["model"][key] is None) or torch.equal(value, d["model"][key]), key
    assert "decoder.layers.1.mlp.shared_experts.gate_weight" in a["model"]


@pytest.mark.parametrize("flags,message", [
    (["--target-expert-parallel-size", "3"], "does not divide the model's numExperts (4)"),
    (["--save-model-type", "hf", "--target-expert-parallel-size", "2", "--model-type-hf", "mixtral"],
     "targetExpertParallelSize must be 1"),
])
def test_moe_convert_errors(moe_models, tmp_path, capsys, flags, message):
    code = main(["convert", "--load-model-type", "hf", "--load-dir", str(moe_models / "mixtral"), "--save-dir",
                 str(tmp_path / "out"), *flags])
    assert code != 0
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_dense_model_refuses_expert_parallelism(tmp_path, capsys):
    make_hf_model("qwen3", tmp_path / "hf")
    assert main(["convert", "--load-dir", str(tmp_path / "hf"), "--save-dir", str(tmp_path / "out"),
                 "--target-expert-parallel-size", "2"]) != 0
    assert "needs an MoE model" in capsys.readouterr().err


def test_sparse_step_refused(tmp_path, capsys):
    """Dense layers between MoE layers are refused at conversion, naming config.json."""
    make_hf_model("qwen3_moe", tmp_path / "hf", decoder_sparse_step=2)
    assert main(["convert", "--load-dir", str(tmp_path / "hf"), "--save-dir", str(tmp_path / "out")]) != 0
    err = capsys.readouterr().err
    assert "config.json" in err and "decoder_sparse_step" in err
