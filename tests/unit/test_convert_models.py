"""Tiny random HF models of each supported family (also used by tests/engine/test_convert_parity.py), and the
HF config -> ModelConfig translation checked on them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

# One per family, each with the feature that family's mapping must get right.
FAMILY_CONFIGS = {
    # head_dim (32) != hidden / heads (16), GQA 4:2, q/k norms, untied, vocab not a multiple of 128
    "qwen3": dict(model_type="qwen3", vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=128),
    # q/k/v biases, GQA
    "qwen2": dict(model_type="qwen2", vocab_size=270, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, rope_theta=10000.0,
                  rms_norm_eps=1e-6, max_position_embeddings=128),
    # tied embeddings, plain multi-head attention
    "llama2": dict(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True, rope_theta=10000.0,
                   rms_norm_eps=1e-5, max_position_embeddings=128),
}

# Mixture-of-experts families (tests/unit/test_convert_moe.py, tests/engine/test_moe_parity.py): 4 experts, top 2.
MOE_FAMILY_CONFIGS = {
    # q/k norms, GQA, renormalised top-k (norm_topk_prob), expert size != dense size
    "qwen3_moe": dict(model_type="qwen3_moe", vocab_size=300, hidden_size=64, intermediate_size=96,
                      moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                      tie_word_embeddings=False, rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=128),
    # block_sparse_moe names (w1/w3/w2), always renormalised
    "mixtral": dict(model_type="mixtral", vocab_size=256, hidden_size=64, intermediate_size=48, num_local_experts=4,
                    num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    tie_word_embeddings=False, rope_theta=1000000.0, rms_norm_eps=1e-5, max_position_embeddings=128),
    # shared expert with its sigmoid gate, q/k/v biases, top-k not renormalised (pre-softmax)
    "qwen2_moe": dict(model_type="qwen2_moe", vocab_size=270, hidden_size=64, intermediate_size=96,
                      moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=4,
                      num_experts_per_tok=2, norm_topk_prob=False, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, tie_word_embeddings=False, rope_theta=10000.0, rms_norm_eps=1e-6,
                      max_position_embeddings=128),
}


def write_tokenizer(directory: Path, vocab_size: int) -> None:
    """A tiny byte-level BPE trained on the spot, saved as tokenizer.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog " * 20], trainer)
    tok.save(str(directory / "tokenizer.json"))


def make_hf_model(family: str, directory: Path, seed: int = 0, dtype=torch.float32, **overrides):
    """Save a random model of ``family`` with save_pretrained; every weight (norms and biases too) is random,
    so a misplaced tensor cannot go unnoticed."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = {**(FAMILY_CONFIGS.get(family) or MOE_FAMILY_CONFIGS[family]), **overrides}
    config = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.2 if "norm" in name else 0.05)
    model.eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, max_shard_size="100KB")
    write_tokenizer(directory, 200)
    return model


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
def test_hf_config_translation(tmp_path, family):
    from ascend_engine.convert.hf_config import family_for, hf_config_from_model, model_config_from_hf

    make_hf_model(family, tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    model = model_config_from_hf(hf, "config.json", make_vocab_size_divisible_by=128)
    spec = FAMILY_CONFIGS[family]
    assert model.numLayers == spec["num_hidden_layers"]
    assert model.head_dim == spec.get("head_dim", spec["hidden_size"] // spec["num_attention_heads"])
    assert model.num_query_groups == spec["num_key_value_heads"]
    assert model.qkLayernorm == (family == "qwen3")
    assert model.addQkvBias == (family == "qwen2")
    assert model.untieEmbeddingsAndOutputWeights == (not spec["tie_word_embeddings"])
    assert model.rotaryBase == spec["rope_theta"]
    assert model.padded_vocab_size(2) % 256 == 0
    # and back: the generated config.json describes the same model
    again = hf_config_from_model(model, family_for(hf, None, "config.json"), "float32")
    assert model_config_from_hf(again, "generated") == model.model_copy(update={"paddedVocabSize": None,
                                                                                 "makeVocabSizeDivisibleBy": 128})
