"""hf -> mg -> hf and mg -> mg -> mg round trips are bit-identical; Megatron files have Megatron's layout."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ascend_engine.cli import main
from test_convert_models import FAMILY_CONFIGS, make_hf_model

LAYOUTS = [(1, 1), (2, 1), (1, 2), (2, 2)]


def convert(*flags) -> None:
    assert main(["convert", *map(str, flags)]) == 0


def hf_tensors(directory: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(directory.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def mg_states(root: Path) -> dict[str, dict]:
    """rank folder name -> the whole file as torch.load sees it."""
    it = (root / "latest_checkpointed_iteration.txt").read_text().strip()
    folder = root / (it if it == "release" else f"iter_{int(it):07d}")
    return {d.name: torch.load(d / "model_optim_rng.pt", weights_only=False) for d in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    for family in FAMILY_CONFIGS:
        make_hf_model(family, root / family)
    return root


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
@pytest.mark.parametrize("tp,pp", LAYOUTS)
def test_hf_mg_hf_is_bit_identical(hf_models, tmp_path, family, tp, pp):
    src = hf_models / family
    convert("--load-model-type", "hf", "--save-model-type", "mg", "--load-dir", src, "--save-dir", tmp_path / "mg",
            "--target-tensor-parallel-size", tp, "--target-pipeline-parallel-size", pp)
    states = mg_states(tmp_path / "mg")
    expected = {f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else "") for t in range(tp) for p in range(pp)}
    assert set(states) == expected
    for state in states.values():
        assert state["checkpoint_version"] == 3.0 and "iteration" in state
        assert state["args"].tensor_model_parallel_size == tp and state["args"].pipeline_model_parallel_size == pp
    convert("--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", tmp_path / "mg", "--save-dir",
            tmp_path / "hf", "--model-type-hf", family, "--tokenizer-model", src / "tokenizer.json")
    before, after = hf_tensors(src), hf_tensors(tmp_path / "hf")
    assert sorted(before) == sorted(after)
    for name in before:
        assert before[name].dtype == after[name].dtype and torch.equal(before[name], after[name]), name
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()


def test_megatron_shards_follow_megatron_conventions(hf_models, tmp_path):
    """GQA rows per group, gate/up per rank, padded vocab (last row repeated), local layer numbers per stage."""
    src = hf_models / "qwen3"
    convert("--load-dir", src, "--save-dir", tmp_path, "--target-tensor-parallel-size", 2,
            "--target-pipeline-parallel-size", 2)
    hf = hf_tensors(src)
    states = mg_states(tmp_path)
    first, last = states["mp_rank_01_000"]["model"], states["mp_rank_01_001"]["model"]
    # vocab 300 padded to a multiple of 128 x TP 2 = 512; rank 1 holds rows 256..511, 44 real ones then padding
    emb = first["embedding.word_embeddings.weight"]
    assert emb.shape == (256, 64)
    assert torch.equal(emb[:44], hf["model.embed_tokens.weight"][256:])
    assert torch.equal(emb[44:], hf["model.embed_tokens.weight"][-1].expand(212, 64))
    assert first["decoder.layers.0.self_attention.linear_qkv._extra_state"] is None
    # rank 1 has query group 1: its 2 query heads, then k_1, then v_1 (head_dim 32)
    qkv = first["decoder.layers.1.self_attention.linear_qkv.weight"]
    q, k, v = (hf[f"model.layers.1.self_attn.{n}_proj.weight"] for n in "qkv")
    assert torch.equal(qkv, torch.cat([q[64:128], k[32:64], v[32:64]]))
    # stage 1 numbers its layers from 0: its layer 0 is global layer 2; fc1 on rank 1 is [gate_1; up_1]
    fc1 = last["decoder.layers.0.mlp.linear_fc1.weight"]
    gate, up = hf["model.layers.2.mlp.gate_proj.weight"], hf["model.layers.2.mlp.up_proj.weight"]
    assert torch.equal(fc1, torch.cat([gate[48:], up[48:]]))
    assert torch.equal(last["decoder.layers.0.self_attention.linear_proj.weight"],
                       hf["model.layers.2.self_attn.o_proj.weight"][:, 64:])
    assert "embedding.word_embeddings.weight" not in last and "output_layer.weight" not in first
    assert states["mp_rank_00_000"]["args"].padded_vocab_size == 512


def test_tied_embeddings_on_the_last_stage(hf_models, tmp_path):
    convert("--load-dir", hf_models / "llama2", "--save-dir", tmp_path, "--target-pipeline-parallel-size", 2)
    states = mg_states(tmp_path)
    emb = states["mp_rank_00_000"]["model"]["embedding.word_embeddings.weight"]
    assert torch.equal(states["mp_rank_00_001"]["model"]["output_layer.weight"], emb)
    assert states["mp_rank_00_000"]["args"].untie_embeddings_and_output_weights is False


def test_mg_mg_mg_is_bit_identical(hf_models, tmp_path):
    """1x1 -> 2x2 -> uneven 2x2 (1+3 layers) -> 1x1 gives back the same files' tensors."""
    convert("--load-dir", hf_models / "qwen2", "--save-dir", tmp_path / "a", "--make-vocab-size-divisible-by", 64)
    convert("--load-model-type", "mg", "--save-model-type", "mg", "--load-dir", tmp_path / "a", "--save-dir",
            tmp_path / "b", "--target-tensor-parallel-size", 2, "--target-pipeline-parallel-size", 2)
    convert("--load-model-type", "mg", "--save-model-type", "mg", "--load-dir", tmp_path / "b", "--save-dir",
            tmp_path / "c", "--target-tensor-parallel-size", 2, "--target-pipeline-parallel-size", 2,
            "--num-layer-list", "1,3")
    c = mg_states(tmp_path / "c")
    assert sum(k.endswith("input_layernorm.weight") for k in c["mp_rank_00_000"]["model"]) == 1
    assert c["mp_rank_00_000"]["args"].num_layer_list == "1,3"
    convert("--load-model-type", "mg", "--save-model-type", "mg", "--load-dir", tmp_path / "c", "--save-dir",
            tmp_path / "d")
    a, d = mg_states(tmp_path / "a")["mp_rank_00"], mg_states(tmp_path / "d")["mp_rank_00"]
    assert list(a["model"]) == list(d["model"])
    for key, value in a["model"].items():
        assert (value is None and d["model"][key] is None) or torch.equal(value, d["model"][key]), key
    assert a["args"].padded_vocab_size == d["args"].padded_vocab_size == 320


def test_params_dtype_casts(hf_models, tmp_path):
    convert("--load-dir", hf_models / "qwen3", "--save-dir", tmp_path / "mg", "--params-dtype", "bf16")
    state = mg_states(tmp_path / "mg")["mp_rank_00"]
    assert state["model"]["decoder.final_layernorm.weight"].dtype == torch.bfloat16 and state["args"].bf16
    convert("--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", tmp_path / "mg", "--save-dir",
            tmp_path / "hf", "--hf-cfg-dir", hf_models / "qwen3")
    after = hf_tensors(tmp_path / "hf")
    before = hf_tensors(hf_models / "qwen3")
    assert all(t.dtype == torch.bfloat16 for t in after.values())
    assert torch.equal(after["model.norm.weight"], before["model.norm.weight"].to(torch.bfloat16))
    import json

    assert json.loads((tmp_path / "hf" / "config.json").read_text())["dtype"] == "bfloat16"


def test_config_file_section(hf_models, tmp_path):
    """The operator's CheckpointConvert resource carries the same fields under spec.convert."""
    cfg = tmp_path / "ckc.yaml"
    cfg.write_text(f"apiVersion: ascendtrain.dev/v1alpha1\nkind: CheckpointConvert\nspec:\n  convert:\n"
                   f"    loadDir: {hf_models / 'llama2'}\n    saveDir: {tmp_path / 'out'}\n"
                   f"    targetTensorParallelSize: 2\n    numLayerList: [3, 1]\n"
                   f"    targetPipelineParallelSize: 2\n")
    convert("--config", cfg)
    assert set(mg_states(tmp_path / "out")) == {"mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000",
                                                  "mp_rank_01_001"}


def test_hf_to_megatron_runs_without_torch(hf_models, tmp_path):
    """Importing torch costs more CPU than copying a gigabyte, so the conversion every training starts from
    (HF -> Megatron, resharded) must never pull it in; the files it writes are still what torch.load reads."""
    argv = ["convert", "--load-model-type", "hf", "--save-model-type", "mg", "--load-dir", str(hf_models / "qwen3"),
            "--save-dir", str(tmp_path / "mg"), "--target-tensor-parallel-size", "2"]
    code = f"import sys; from ascend_engine.cli import main; print(main({argv!r}), 'torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split()[-2:] == ["0", "False"], run.stdout + run.stderr
    assert set(mg_states(tmp_path / "mg")) == {"mp_rank_00", "mp_rank_01"}


def test_any_saved_iteration_exports_with_ckpt_step(hf_models, tmp_path, capsys):
    """A training run's folder holds iter_0000010 and iter_0000030 (latest); --ckpt-step 10 (alias
    --load-iteration) exports the earlier one mg -> hf and mg -> mg, the default still the latest."""
    make_hf_model("qwen3", tmp_path / "later", seed=1)
    run = tmp_path / "run"
    run.mkdir()
    for iteration, src in ((10, hf_models / "qwen3"), (30, tmp_path / "later")):
        convert("--load-dir", src, "--save-dir", tmp_path / f"conv{iteration}")
        (tmp_path / f"conv{iteration}" / "release").rename(run / f"iter_{iteration:07d}")
    (run / "latest_checkpointed_iteration.txt").write_text("30")
    common = ("--load-model-type", "mg", "--save-model-type", "hf", "--model-type-hf", "qwen3", "--load-dir", run)
    convert(*common, "--ckpt-step", 10, "--save-dir", tmp_path / "hf10")
    convert(*common, "--save-dir", tmp_path / "hf30")
    for out, src in (("hf10", hf_models / "qwen3"), ("hf30", tmp_path / "later")):
        want, got = hf_tensors(src), hf_tensors(tmp_path / out)
        assert all(torch.equal(want[n], got[n]) for n in want), out
    convert("--load-model-type", "mg", "--load-dir", run, "--load-iteration", 10, "--save-dir", tmp_path / "mg10",
            "--target-tensor-parallel-size", 2)
    assert (tmp_path / "mg10" / "latest_checkpointed_iteration.txt").read_text().strip() == "10"
    assert set(mg_states(tmp_path / "mg10")) == {"mp_rank_00", "mp_rank_01"}
    capsys.readouterr()
    assert main(["convert", *map(str, common), "--ckpt-step", "20", "--save-dir", str(tmp_path / "hf20")]) == 1
    assert f"{run}/iter_0000020: no such iteration (saved: 10, 30)" in capsys.readouterr().err
    assert not (tmp_path / "hf20").exists()
