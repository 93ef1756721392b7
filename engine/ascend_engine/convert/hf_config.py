"""HF ``config.json`` <-> our ``ModelConfig`` (the trainer reuses ``model_config_from_hf`` to start from HF).

Only the decoder-only families in families.py are understood; anything that changes the weights in a way
Megatron's GPTModel cannot express (a bias on o_proj or the MLP, another activation) is refused here, so the
converter never writes a checkpoint that would load but compute something else.
"""
from __future__ import annotations

from typing import Any

from ..config.model import ModelConfig
from .families import FAMILIES, Family, MappingError

# config.json "model_type" -> the features Megatron needs that the type implies
_QWEN2_QKV_BIAS = {"qwen2", "qwen2_moe"}
_QK_NORM = {"qwen3", "qwen3_moe"}
_MOE = {"qwen3_moe", "qwen2_moe", "mixtral"}
SUPPORTED_MODEL_TYPES = {"qwen3", "qwen2", "llama"} | _MOE


def _moe_fields(hf: dict[str, Any], model_type: str, source: str) -> dict[str, Any]:
    """ModelConfig's MoE fields from a sparse-MoE config.json (empty for dense types)."""
    if model_type not in _MOE:
        return {}
    if hf.get("mlp_only_layers") or int(hf.get("decoder_sparse_step") or 1) != 1:
        raise MappingError(f"{source}: dense layers between MoE layers (mlp_only_layers / decoder_sparse_step > 1) "
                           f"are not supported; every layer must be an MoE layer")
    # Qwen's own configs say num_experts; transformers 5 writes num_local_experts for every family.
    experts = hf.get("num_experts") or hf.get("num_local_experts")
    if not experts:
        raise MappingError(f"{source}: missing field 'num_experts' (or 'num_local_experts')")
    expert_size = hf["intermediate_size"] if model_type == "mixtral" else hf["moe_intermediate_size"]
    # Mixtral always renormalises the top-k probabilities; Qwen does when norm_topk_prob. Renormalised top-k of a
    # softmax equals Megatron's default softmax over the top-k logits; without it Megatron's pre-softmax matches.
    renormalised = model_type == "mixtral" or bool(hf.get("norm_topk_prob", False))
    fields = dict(numExperts=int(experts), moeRouterTopk=int(hf["num_experts_per_tok"]),
                  moeFfnHiddenSize=int(expert_size), moeRouterPreSoftmax=not renormalised,
                  moeAuxLossCoeff=float(hf.get("router_aux_loss_coef") or 0.0))
    if model_type == "qwen2_moe" and hf.get("shared_expert_intermediate_size"):
        fields.update(moeSharedExpertIntermediateSize=int(hf["shared_expert_intermediate_size"]),
                      moeSharedExpertGate=True)
    return fields


def _rope_theta(hf: dict[str, Any]) -> float:
    params = hf.get("rope_parameters") or {}
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    return float(theta)


def family_for(hf: dict[str, Any], requested: str | None, source: str) -> Family:
    """The family a config.json belongs to; ``requested`` (--model-type-hf) must agree with it."""
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise MappingError(f"{source}: unknown architecture model_type={model_type!r} "
                           f"(architectures={hf.get('architectures')}); supported: "
                           f"{', '.join(sorted(SUPPORTED_MODEL_TYPES))}")
    if requested is None:
        if model_type == "llama":
            return FAMILIES["llama3" if _rope_theta(hf) >= 500000 else "llama2"]
        return FAMILIES[model_type]
    family = FAMILIES[requested]
    compatible = {family.hf_model_type} | ({"qwen2"} if requested in ("llama2", "llama3") else set())
    if model_type not in compatible:
        raise MappingError(f"{source}: model_type is {model_type!r} but --model-type-hf is {requested!r}")
    return family


def is_score_model(hf: dict[str, Any]) -> bool:
    """A sequence classifier with one label (a reward model: ``score`` head instead of ``lm_head``)."""
    if not any(a.endswith("ForSequenceClassification") for a in hf.get("architectures") or ()):
        return False
    labels = len(hf.get("id2label") or {}) or int(hf.get("num_labels") or 2)
    if labels != 1:
        raise MappingError(f"config.json: a sequence classifier with {labels} labels; only reward models "
                           f"(num_labels 1) are supported")
    return True


def score_model_fields(hf: dict[str, Any], family: Family, model: ModelConfig, pad_token_id: int | None,
                       source: str) -> dict[str, Any]:
    """``hf`` (generated or copied from --hf-cfg-dir) made the reward model's config: its class, one label and
    the padding token HF's classifier uses to find each row's last real token."""
    if not model.scoreHead:
        if is_score_model(hf):
            raise MappingError(f"{source}: describes a reward model ({hf['architectures'][0]}) but the checkpoint "
                               f"is a language model (no score head)")
        return hf
    pad = hf.get("pad_token_id")
    pad = pad if pad is not None else pad_token_id
    if pad is None:
        raise MappingError(f"{source}: a reward model needs pad_token_id in config.json (HF's sequence classifier "
                           f"scores each row's last non-padding token); give --tokenizer-model or --hf-cfg-dir "
                           f"with a tokenizer that has a pad or eos token")
    return hf | {"architectures": [family.architecture_for(model)], "id2label": {"0": "LABEL_0"},
                 "label2id": {"LABEL_0": 0}, "pad_token_id": int(pad)}


def model_config_from_hf(hf: dict[str, Any], source: str, make_vocab_size_divisible_by: int = 128,
                         padded_vocab_size: int | None = None) -> ModelConfig:
    """Translate a HF config dict; ``source`` names the file in errors."""
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise MappingError(f"{source}: unknown architecture model_type={model_type!r}")
    if hf.get("hidden_act", "silu") != "silu":
        raise MappingError(f"{source}: hidden_act={hf.get('hidden_act')!r} is not supported (SwiGLU needs silu)")
    if model_type == "qwen2_moe" and not hf.get("qkv_bias", True):
        raise MappingError(f"{source}: qkv_bias=false is not supported for qwen2_moe")
    if hf.get("attention_bias") and model_type not in _QWEN2_QKV_BIAS:
        raise MappingError(f"{source}: attention_bias=true puts a bias on o_proj, which Megatron's "
                           f"--add-qkv-bias does not have; not supported")
    if hf.get("mlp_bias"):
        raise MappingError(f"{source}: mlp_bias=true is not supported")
    try:
        heads = int(hf["num_attention_heads"])
        hidden = int(hf["hidden_size"])
        groups = int(hf.get("num_key_value_heads") or heads)
        head_dim = int(hf.get("head_dim") or hidden // heads)
        return ModelConfig(
            numLayers=int(hf["num_hidden_layers"]), hiddenSize=hidden, ffnHiddenSize=int(hf["intermediate_size"]),
            numAttentionHeads=heads, groupQueryAttention=groups != heads, numQueryGroups=groups,
            kvChannels=head_dim, maxPositionEmbeddings=hf.get("max_position_embeddings"),
            vocabSize=int(hf["vocab_size"]), paddedVocabSize=padded_vocab_size,
            makeVocabSizeDivisibleBy=make_vocab_size_divisible_by, normalization="RMSNorm",
            normEpsilon=float(hf.get("rms_norm_eps", 1e-6)), swiglu=True, positionEmbeddingType="rope",
            rotaryBase=_rope_theta(hf), qkLayernorm=model_type in _QK_NORM,
            addQkvBias=model_type in _QWEN2_QKV_BIAS, addBiasLinear=False,
            untieEmbeddingsAndOutputWeights=not hf.get("tie_word_embeddings", False),  # the classes default to untied
            scoreHead=is_score_model(hf),
            **_moe_fields(hf, model_type, source),
        )
    except MappingError:
        raise  # already names the file
    except KeyError as e:
        raise MappingError(f"{source}: missing field {e.args[0]!r}") from None
    except ValueError as e:
        raise MappingError(f"{source}: {e}") from None


_SHAPE_FIELDS = ("numLayers", "hiddenSize", "ffn_hidden_size", "numAttentionHeads", "num_query_groups", "head_dim",
                 "vocabSize", "qkLayernorm", "addQkvBias", "untieEmbeddingsAndOutputWeights", "rotaryBase",
                 "normEpsilon", "numExperts", "moeRouterTopk", "moe_ffn_hidden_size", "moeRouterPreSoftmax",
                 "moeSharedExpertIntermediateSize", "moeSharedExpertGate", "moeLayerFreq")


def check_same_model(a: ModelConfig, b: ModelConfig, what_a: str, what_b: str) -> None:
    """Refuse to pair a checkpoint with a config.json of another shape."""
    diff = [f"{f}: {getattr(a, f)} vs {getattr(b, f)}" for f in _SHAPE_FIELDS if getattr(a, f) != getattr(b, f)]
    if diff:
        raise MappingError(f"{what_a} and {what_b} describe different models: " + "; ".join(diff))


def _hf_moe_kwargs(model: ModelConfig, family: Family) -> dict[str, Any]:
    """config.json's MoE fields for ``family`` (inverse of ``_moe_fields``)."""
    moe_family = family.hf_model_type in _MOE
    if moe_family != (model.numExperts is not None):
        raise MappingError(f"the checkpoint is {'an MoE' if model.numExperts else 'a dense'} model; "
                           f"{family.architecture} is {'an MoE' if moe_family else 'a dense'} architecture")
    if not moe_family:
        return {}
    if model.moeLayerFreq != 1:
        raise MappingError(f"moeLayerFreq={model.moeLayerFreq}: {family.architecture} here needs every layer MoE")
    kwargs = dict(num_experts_per_tok=model.moeRouterTopk, router_aux_loss_coef=model.moeAuxLossCoeff)
    if family.hf_model_type == "mixtral":
        return kwargs | dict(num_local_experts=model.numExperts, intermediate_size=model.moe_ffn_hidden_size)
    kwargs |= dict(num_experts=model.numExperts, moe_intermediate_size=model.moe_ffn_hidden_size,
                   norm_topk_prob=not model.moeRouterPreSoftmax, decoder_sparse_step=1, mlp_only_layers=[])
    if family.hf_model_type == "qwen2_moe":
        kwargs["shared_expert_intermediate_size"] = model.moeSharedExpertIntermediateSize
    return kwargs


def hf_config_from_model(model: ModelConfig, family: Family, dtype: str) -> dict[str, Any]:
    """A complete config.json for ``model`` in ``family``'s HF class, via transformers' own config class."""
    from transformers import AutoConfig

    if model.addBiasLinear or model.normalization != "RMSNorm" or not model.swiglu:
        raise MappingError(f"the checkpoint's model (bias on all linears, LayerNorm or no SwiGLU) has no "
                           f"{family.architecture} equivalent")
    kwargs = dict(
        vocab_size=model.vocabSize, hidden_size=model.hiddenSize, intermediate_size=model.ffn_hidden_size,
        num_hidden_layers=model.numLayers, num_attention_heads=model.numAttentionHeads,
        num_key_value_heads=model.num_query_groups, head_dim=model.head_dim,
        rms_norm_eps=model.normEpsilon, rope_theta=model.rotaryBase,
        tie_word_embeddings=not model.untieEmbeddingsAndOutputWeights, hidden_act="silu",
        architectures=[family.architecture_for(model)], dtype=dtype,
    )
    if model.scoreHead:
        kwargs["num_labels"] = 1
    if model.maxPositionEmbeddings:
        kwargs["max_position_embeddings"] = model.maxPositionEmbeddings
    kwargs.update(_hf_moe_kwargs(model, family))
    hf = AutoConfig.for_model(family.hf_model_type, **kwargs).to_dict()
    check_same_model(model_config_from_hf(hf, "generated config.json"), model, "generated config.json",
                     "the checkpoint")
    return hf
