"""Reward models (``*ForSequenceClassification``, one label) through ``ascend-engine convert``.

HF -> Megatron (TP=2) -> HF of a random classifier gives back every tensor bit for bit, the ``score`` head
included, and a config that transformers loads as the same one-label classifier. A Megatron checkpoint does not
know the padding token: the HF side takes it from --hf-cfg-dir's config or from the tokenizer, else refuses. Llama2 here
has tied embeddings (the classifier has no LM head to tie), Qwen2 has q/k/v biases.
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from test_convert_models import FAMILY_CONFIGS, write_tokenizer


def _make_classifier(family: str, directory, pad_token_id: int | None = 3):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    kwargs = dict(FAMILY_CONFIGS[family], num_hidden_layers=2, num_labels=1, pad_token_id=pad_token_id)
    config = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.2 if "norm" in name else 0.05)
    model.save_pretrained(directory)
    return model.eval()


def _tensors(directory) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(directory.glob("*.safetensors")):
        out.update(load_file(f))
    return out


@pytest.mark.parametrize("family, architecture", [("llama2", "LlamaForSequenceClassification"),
                                                  ("qwen2", "Qwen2ForSequenceClassification")])
def test_classifier_round_trip(tmp_path, family, architecture):
    from ascend_engine.cli import main
    from transformers import AutoModelForSequenceClassification

    original = _make_classifier(family, tmp_path / "hf")
    assert main(["convert", "--load-dir", str(tmp_path / "hf"), "--save-dir", str(tmp_path / "mg"),
                 "--target-tensor-parallel-size", "2"]) == 0
    assert main(["convert", "--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", str(tmp_path / "mg"),
                 "--save-dir", str(tmp_path / "back"), "--hf-cfg-dir", str(tmp_path / "hf")]) == 0
    before, after = _tensors(tmp_path / "hf"), _tensors(tmp_path / "back")
    assert "score.weight" in after and "lm_head.weight" not in after
    assert sorted(before) == sorted(after)
    for name, tensor in before.items():
        assert torch.equal(tensor, after[name]), name
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["architectures"] == [architecture]
    assert config["pad_token_id"] == 3
    back = AutoModelForSequenceClassification.from_pretrained(tmp_path / "back").eval()
    ids = torch.tensor([[5, 9, 17, 3, 3], [7, 1, 2, 8, 4]])
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, original(ids).logits, rtol=0, atol=0)


def test_classifier_without_padding_token_needs_a_tokenizer(tmp_path):
    from ascend_engine.cli import main

    _make_classifier("qwen2", tmp_path / "hf", pad_token_id=None)
    assert main(["convert", "--load-dir", str(tmp_path / "hf"), "--save-dir", str(tmp_path / "mg")]) == 0
    out = ["convert", "--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", str(tmp_path / "mg"),
           "--model-type-hf", "qwen2"]
    assert main([*out, "--save-dir", str(tmp_path / "refused")]) != 0
    assert not (tmp_path / "refused" / "config.json").exists()
    (tmp_path / "tok").mkdir()
    write_tokenizer(tmp_path / "tok", 200)
    (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>"}))  # no pad token: eos stands in
    assert main([*out, "--save-dir", str(tmp_path / "back"), "--tokenizer-model", str(tmp_path / "tok")]) == 0
    assert json.loads((tmp_path / "back" / "config.json").read_text())["pad_token_id"] == 2  # "</s>"


def test_multi_label_classifier_is_refused():
    from ascend_engine.convert.families import MappingError
    from ascend_engine.convert.hf_config import model_config_from_hf

    hf = dict(FAMILY_CONFIGS["qwen2"], architectures=["Qwen2ForSequenceClassification"],
              id2label={"0": "bad", "1": "good"})
    with pytest.raises(MappingError, match="2 labels"):
        model_config_from_hf(hf, "config.json")
