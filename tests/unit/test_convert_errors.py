"""Every bad input stops with a message naming the problem, before anything is written."""
from __future__ import annotations

import json
import shutil

import pytest

from ascend_engine.cli import main
from test_convert_models import make_hf_model


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    path = tmp_path_factory.mktemp("q") / "hf"
    make_hf_model("qwen3", path)
    return path


@pytest.fixture(scope="module")
def qwen3_mg(qwen3, tmp_path_factory):
    out = tmp_path_factory.mktemp("q") / "mg"
    assert main(["convert", "--load-dir", str(qwen3), "--save-dir", str(out), "--target-tensor-parallel-size", "2"]) == 0
    return out


def fails(capsys, tmp_path, *flags, code=None) -> str:
    """Run convert, expect failure, expect nothing at --save-dir; return stderr."""
    rc = main(["convert", *map(str, flags), "--save-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc != 0 and (code is None or rc == code), err
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if "convert-tmp" in p.name]
    return err


def copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_unknown_architecture(capsys, tmp_path, qwen3):
    bad = copy(qwen3, tmp_path / "gpt2")
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    assert "unknown architecture model_type='gpt2'" in fails(capsys, tmp_path, "--load-dir", bad)


def test_family_disagreeing_with_config(capsys, tmp_path, qwen3):
    assert "--model-type-hf is 'qwen2'" in fails(capsys, tmp_path, "--load-dir", qwen3, "--model-type-hf", "qwen2")


@pytest.mark.parametrize("tp,field", [(3, "numAttentionHeads (4)"), (4, "numQueryGroups (2)")])
def test_tp_must_divide_heads_and_groups(capsys, tmp_path, qwen3, tp, field):
    err = fails(capsys, tmp_path, "--load-dir", qwen3, "--target-tensor-parallel-size", tp, code=2)
    assert f"targetTensorParallelSize ({tp}) does not divide the model's {field}" in err


def test_tp_must_divide_ffn(capsys, tmp_path):
    make_hf_model("llama2", tmp_path / "hf", intermediate_size=98)
    err = fails(capsys, tmp_path, "--load-dir", tmp_path / "hf", "--target-tensor-parallel-size", 4, code=2)
    assert "ffnHiddenSize (98)" in err


def test_pp_must_divide_layers_unless_num_layer_list(capsys, tmp_path, qwen3):
    err = fails(capsys, tmp_path, "--load-dir", qwen3, "--target-pipeline-parallel-size", 3, code=2)
    assert "does not divide the model's 4 layers" in err and "--num-layer-list" in err
    err = fails(capsys, tmp_path, "--load-dir", qwen3, "--target-pipeline-parallel-size", 2, "--num-layer-list",
                "1,2", code=2)
    assert "sums to 3" in err
    err = fails(capsys, tmp_path, "--load-dir", qwen3, "--target-pipeline-parallel-size", 2, "--num-layer-list",
                "1,1,2", code=2)
    assert "numLayerList has 3 entries" in err


def test_missing_shard(capsys, tmp_path, qwen3):
    bad = copy(qwen3, tmp_path / "hf")
    (bad / "model-00002-of-00010.safetensors").unlink()
    assert "shard model-00002-of-00010.safetensors is missing" in fails(capsys, tmp_path, "--load-dir", bad)


def test_truncated_shard(capsys, tmp_path, qwen3):
    bad = copy(qwen3, tmp_path / "hf")
    shard = bad / "model-00003-of-00010.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    assert "truncated" in fails(capsys, tmp_path, "--load-dir", bad)


def test_garbage_shard(capsys, tmp_path, qwen3):
    bad = copy(qwen3, tmp_path / "hf")
    (bad / "model-00001-of-00010.safetensors").write_bytes(b"\xff" * 64)
    assert "corrupt safetensors header" in fails(capsys, tmp_path, "--load-dir", bad)


def test_missing_and_corrupt_megatron_rank(capsys, tmp_path, qwen3_mg):
    bad = copy(qwen3_mg, tmp_path / "mg")
    (bad / "release" / "mp_rank_01" / "model_optim_rng.pt").unlink()
    err = fails(capsys, tmp_path, "--load-model-type", "mg", "--load-dir", bad)
    assert "mp_rank_01/model_optim_rng.pt: rank file is missing" in err
    bad = copy(qwen3_mg, tmp_path / "mg2")
    rank = bad / "release" / "mp_rank_01" / "model_optim_rng.pt"
    rank.write_bytes(rank.read_bytes()[:-5000])
    assert "not a readable torch checkpoint" in fails(capsys, tmp_path, "--load-model-type", "mg", "--load-dir", bad)


def test_not_a_checkpoint(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    assert "latest_checkpointed_iteration.txt" in fails(capsys, tmp_path, "--load-model-type", "mg", "--load-dir",
                                                        tmp_path / "empty")


def test_saving_hf_needs_a_family(capsys, tmp_path, qwen3_mg):
    err = fails(capsys, tmp_path, "--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", qwen3_mg,
                code=2)
    assert "--model-type-hf" in err


def test_existing_output_is_not_overwritten(capsys, tmp_path, qwen3, qwen3_mg):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    rc = main(["convert", "--load-dir", str(qwen3_mg), "--save-dir", str(tmp_path / "out"), "--save-model-type", "hf",
               "--load-model-type", "mg", "--model-type-hf", "qwen3"])
    assert rc == 2 and "refusing" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]
    rc = main(["convert", "--load-dir", str(qwen3), "--save-dir", str(qwen3_mg)])  # release/ exists there
    assert rc == 2 and "already exists" in capsys.readouterr().err


def test_yaml_error_names_file_and_line(capsys, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("loadDir: /x\nsaveDir: /y\ntargetTensorParallelSize: 0\n")
    assert main(["convert", "--config", str(cfg)]) == 2
    assert f"{cfg}:3: targetTensorParallelSize" in capsys.readouterr().err


def test_an_error_names_its_file_once(capsys, tmp_path, qwen3):
    bad = copy(qwen3, tmp_path / "moe")
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "qwen3_moe"}))
    err = fails(capsys, tmp_path, "--load-dir", bad)
    assert err.count("config.json") == 1 and "missing field 'num_experts'" in err
    bad = copy(qwen3, tmp_path / "dir")
    (bad / "config.json").unlink()
    (bad / "config.json").mkdir()  # an OSError's own text would name the file a second time
    err = fails(capsys, tmp_path, "--load-dir", bad)
    assert err.count("config.json") == 1 and "config.json: unreadable (Is a directory)" in err


def test_ckpt_step_needs_a_megatron_source(capsys, tmp_path, qwen3):
    err = fails(capsys, tmp_path, "--load-dir", qwen3, "--ckpt-step", 10, code=2)
    assert "ckptStep picks an iteration of a Megatron checkpoint" in err
