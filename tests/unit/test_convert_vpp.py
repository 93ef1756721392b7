"""Virtual pipeline stages in the converter: Megatron's model0/model1 chunks per PP rank, round trips bit-exact."""
from __future__ import annotations

import torch

from test_convert_models import make_hf_model
from test_convert_roundtrip import convert, hf_tensors, mg_states


def test_vpp_layout_and_round_trips(tmp_path):
    make_hf_model("qwen3", tmp_path / "hf")  # 4 layers
    convert("--load-dir", tmp_path / "hf", "--save-dir", tmp_path / "vpp", "--target-pipeline-parallel-size", 2,
            "--num-layers-per-virtual-pipeline-stage", 1)
    states = mg_states(tmp_path / "vpp")
    assert sorted(states) == ["mp_rank_00_000", "mp_rank_00_001"]
    first, last = states["mp_rank_00_000"], states["mp_rank_00_001"]
    assert first["args"].virtual_pipeline_model_parallel_size == 2
    assert first["args"].num_layers_per_virtual_pipeline_stage == 1
    assert "model" not in first and sorted(k for k in first if k.startswith("model")) == ["model0", "model1"]
    hf = hf_tensors(tmp_path / "hf")
    # PP rank 0 holds virtual stages 0 and 2 (global layers 0 and 2), rank 1 stages 1 and 3; each chunk numbers
    # its layer 0; the embedding is in the first chunk of rank 0, the output layer in the last chunk of rank 1
    assert torch.equal(first["model1"]["decoder.layers.0.self_attention.linear_proj.weight"],
                       hf["model.layers.2.self_attn.o_proj.weight"])
    assert torch.equal(last["model1"]["decoder.layers.0.self_attention.linear_proj.weight"],
                       hf["model.layers.3.self_attn.o_proj.weight"])
    assert "embedding.word_embeddings.weight" in first["model0"] and "output_layer.weight" in last["model1"]
    assert "output_layer.weight" not in last["model0"] and "embedding.word_embeddings.weight" not in first["model1"]
    # mg (VPP) -> hf gives back the original tensors; mg (VPP) -> mg (plain PP2) equals a direct PP2 conversion
    convert("--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", tmp_path / "vpp", "--save-dir",
            tmp_path / "back", "--model-type-hf", "qwen3")
    back = hf_tensors(tmp_path / "back")
    assert sorted(back) == sorted(hf) and all(torch.equal(hf[n], back[n]) for n in hf)
    convert("--load-model-type", "mg", "--load-dir", tmp_path / "vpp", "--save-dir", tmp_path / "pp2",
            "--target-pipeline-parallel-size", 2)
    convert("--load-dir", tmp_path / "hf", "--save-dir", tmp_path / "direct", "--target-pipeline-parallel-size", 2)
    resharded, direct = mg_states(tmp_path / "pp2"), mg_states(tmp_path / "direct")
    for rank in direct:
        a, b = direct[rank]["model"], resharded[rank]["model"]
        assert list(a) == list(b)
        assert all((a[k] is None and b[k] is None) or torch.equal(a[k], b[k]) for k in a)
