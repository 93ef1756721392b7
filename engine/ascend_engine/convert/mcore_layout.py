"""Megatron-core's local-spec state dict: which keys a model has and how tensor parallelism splits each.

This is family-independent: every family's mapping table targets these names, and Megatron <-> Megatron
resharding needs nothing else. Keys are listed in the order ``GPTModel.state_dict()`` yields them; the
``_extra_state`` entries (None for local layers) are written too, because ``load_state_dict(strict=True)``
expects them.
"""
from __future__ import annotations

import re

from ..config.model import ModelConfig

EMBEDDING = "embedding.word_embeddings.weight"
POSITION_EMBEDDING = "embedding.position_embeddings.weight"
FINAL_NORM = "decoder.final_layernorm"
OUTPUT = "output_layer.weight"
OUTPUT_EXTRA = "output_layer._extra_state"
SCORE = "score.weight"  # a reward model's score head (hidden -> 1), whole on every TP rank
LAYER_PREFIX = "decoder.layers."
_LAYER_KEY = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
ROUTER = "mlp.router.weight"
EXPERTS = "mlp.experts.local_experts."
SHARED_GATE = "mlp.shared_experts.gate_weight"
_EXPERT_KEY = re.compile(r"^(decoder\.layers\.\d+\.mlp\.experts\.local_experts\.)(\d+)\.(.+)$")

# How TP splits a tensor, by the key's ending. "column": dim 0 in rank order; "row": dim 1;
# "vocab": dim 0 after padding; "gate_up": gate and up halves split separately, rank i gets [gate_i; up_i].
_SPLIT_BY_SUFFIX = (
    ("self_attention.linear_qkv.weight", "column"),
    ("self_attention.linear_qkv.bias", "column"),
    ("self_attention.linear_proj.weight", "row"),
    ("linear_fc2.weight", "row"),
    (EMBEDDING, "vocab"),
    (OUTPUT, "vocab"),
)
LORA_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
# LoRA B is split like the weight, A is whole on every rank; for the other targets (row parallel: linear_proj,
# linear_fc2) A is split along dim 1 and B is whole.
COLUMN_PARALLEL = ("linear_qkv", "linear_fc1")


def _mlp_keys(model: ModelConfig, prefix: str) -> list[str]:
    """Keys of one (dense, expert or shared-expert) MLP below ``prefix``."""
    keys = [f"{prefix}linear_fc1.weight"] + ([f"{prefix}linear_fc1.bias"] if model.addBiasLinear else [])
    keys += [f"{prefix}linear_fc1._extra_state", f"{prefix}linear_fc2.weight"]
    keys += [f"{prefix}linear_fc2.bias"] if model.addBiasLinear else []
    return keys + [f"{prefix}linear_fc2._extra_state"]


def layer_keys(model: ModelConfig, layer: int = 0) -> list[str]:
    """Keys inside transformer layer ``layer`` (relative to ``decoder.layers.<i>.``). An MoE layer's routed
    experts are numbered globally here (0..numExperts-1); each expert-parallel rank's file numbers its own from 0."""
    norm_bias = model.normalization == "LayerNorm"
    keys = ["input_layernorm.weight"] + (["input_layernorm.bias"] if norm_bias else [])
    keys += ["self_attention.linear_proj.weight"]
    keys += ["self_attention.linear_proj.bias"] if model.addBiasLinear else []
    keys += ["self_attention.linear_proj._extra_state", "self_attention.linear_qkv.weight"]
    keys += ["self_attention.linear_qkv.bias"] if model.addQkvBias or model.addBiasLinear else []
    keys += ["self_attention.linear_qkv._extra_state"]
    if model.qkLayernorm:
        keys += ["self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight"]
    keys += ["pre_mlp_layernorm.weight"] + (["pre_mlp_layernorm.bias"] if norm_bias else [])
    if not model.is_moe_layer(layer):
        return keys + _mlp_keys(model, "mlp.")
    keys += [ROUTER]
    for e in range(model.numExperts):
        keys += _mlp_keys(model, f"{EXPERTS}{e}.")
    if model.moeSharedExpertIntermediateSize:
        keys += [SHARED_GATE] if model.moeSharedExpertGate else []
        keys += _mlp_keys(model, "mlp.shared_experts.")
    return keys


def stage_keys(model: ModelConfig, first_layer: int, num_layers: int, first: bool, last: bool) -> list[str]:
    """Full keys of one pipeline stage, global layer numbers (callers renumber to local ones when saving)."""
    keys = []
    if first:
        keys.append(EMBEDDING)
        if model.positionEmbeddingType == "learned_absolute":
            keys.append(POSITION_EMBEDDING)
    for i in range(first_layer, first_layer + num_layers):
        keys += [f"{LAYER_PREFIX}{i}.{k}" for k in layer_keys(model, i)]
    if last:
        keys.append(f"{FINAL_NORM}.weight")
        if model.normalization == "LayerNorm":
            keys.append(f"{FINAL_NORM}.bias")
        if model.scoreHead:  # a reward model: the score head in place of the output layer
            keys.append(SCORE)
            return keys
        # Tied embeddings: the last stage of a pipeline keeps its own copy of the embedding as output weight.
        if model.untieEmbeddingsAndOutputWeights or not first:
            keys.append(OUTPUT)
        keys.append(OUTPUT_EXTRA)
    return keys


def model_keys(model: ModelConfig) -> list[str]:
    """Keys of the whole unsplit model (one stage holding everything)."""
    return stage_keys(model, 0, model.numLayers, True, True)


def split_layer_key(key: str) -> tuple[int, str] | None:
    """``decoder.layers.3.mlp.linear_fc1.weight`` -> (3, ``mlp.linear_fc1.weight``)."""
    m = _LAYER_KEY.match(key)
    return (int(m.group(1)), m.group(2)) if m else None


def with_layer(key: str, layer: int) -> str:
    found = split_layer_key(key)
    return f"{LAYER_PREFIX}{layer}.{found[1]}" if found else key


def is_extra_state(key: str) -> bool:
    return key.endswith("._extra_state")


def split_kind(key: str, model: ModelConfig) -> str:
    """How tensor parallelism splits ``key`` (weights, biases and LoRA A/B tensors)."""
    lora = re.match(r"^(.*\.(" + "|".join(LORA_TARGETS) + r"))\.lora_([AB])\.weight$", key)
    if lora:
        module, target, which = lora.groups()
        if target in COLUMN_PARALLEL:
            return "replicated" if which == "A" else split_kind(module + ".weight", model)
        return "row" if which == "A" else "replicated"
    if key.endswith(("linear_fc1.weight", "linear_fc1.bias")):
        return "gate_up" if model.swiglu else "column"
    for suffix, kind in _SPLIT_BY_SUFFIX:
        if key.endswith(suffix):
            return kind
    return "replicated"


def split_expert_key(key: str) -> tuple[str, int, str] | None:
    """``decoder.layers.1.mlp.experts.local_experts.5.linear_fc1.weight`` -> (prefix, 5, ``linear_fc1.weight``)."""
    m = _EXPERT_KEY.match(key)
    return (m.group(1), int(m.group(2)), m.group(3)) if m else None


def expert_range(model: ModelConfig, ep: int, ep_rank: int) -> range:
    """Global numbers of the routed experts expert-parallel rank ``ep_rank`` holds (contiguous, as Megatron)."""
    per_rank = (model.numExperts or 0) // ep
    return range(ep_rank * per_rank, (ep_rank + 1) * per_rank)


def expert_to_local(key: str, model: ModelConfig, ep: int, ep_rank: int) -> str | None:
    """The key in ``ep_rank``'s file (its experts renumbered from 0); None for an expert another rank holds.
    Keys outside the routed experts are in every rank's file unchanged."""
    found = split_expert_key(key)
    if found is None:
        return key
    prefix, expert, rest = found
    owned = expert_range(model, ep, ep_rank)
    return f"{prefix}{expert - owned.start}.{rest}" if expert in owned else None


def expert_to_global(key: str, model: ModelConfig, ep: int, ep_rank: int) -> str:
    """Inverse of ``expert_to_local``."""
    found = split_expert_key(key)
    if found is None:
        return key
    prefix, expert, rest = found
    return f"{prefix}{expert + expert_range(model, ep, ep_rank).start}.{rest}"
