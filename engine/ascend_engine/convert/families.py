"""One declarative HF <-> Megatron-core name mapping per model family (the Megatron-Bridge idea).

A row says: this Megatron key is made from these HF tensors by this rule, and exists only when the model
has this feature. The converter walks the rows both ways; nothing here is specific to a direction.

Rules: ``copy`` (one to one), ``qkv`` (q, k, v fused per query group: for group g the rows are g's query
heads, then k_g, then v_g, so a plain TP chunk keeps whole groups together), ``gate_up`` (gate then up
stacked along dim 0; TP interleaves them per rank in tensor_parallel.py). In MoE rows "{e}" is the routed
expert's global number, on both sides (HF checkpoints keep one tensor per expert on disk).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config.model import ModelConfig
from .arrays import Rows, dense, stack_rows
from .errors import ConvertError
from .mcore_layout import is_extra_state, model_keys, split_expert_key, split_layer_key


class MappingError(ConvertError):
    """A model the family's table cannot express, or HF tensors with unexpected names or shapes."""


@dataclass(frozen=True)
class Row:
    mcore: str  # Megatron key; "{i}" is the layer number
    hf: tuple[str, ...]  # HF tensor names; "{i}" is the layer number
    rule: str = "copy"  # copy | qkv | gate_up
    when: str | None = None  # ModelConfig attribute that must be true for the row to apply


@dataclass(frozen=True)
class Family:
    name: str  # --model-type-hf
    hf_model_type: str  # config.json "model_type"
    architecture: str  # config.json "architectures"
    rows: tuple[Row, ...]
    score_architecture: str | None = None  # the reward model's class (model.scoreHead: HF's score head)

    def architecture_for(self, model: ModelConfig) -> str:
        """config.json "architectures" entry of ``model``: the causal LM, or its sequence classifier."""
        if not model.scoreHead:
            return self.architecture
        if self.score_architecture is None:
            raise MappingError(f"model family {self.name!r} has no sequence-classification (reward model) class")
        return self.score_architecture

    def rows_for(self, model: ModelConfig) -> dict[str, tuple[str, str, tuple[str, ...]]]:
        """Megatron key -> (rule, row pattern, HF names) for every tensor key of ``model``; errors name what is
        missing."""
        active = [r for r in self.rows if r.when is None or getattr(model, r.when)]
        by_pattern = {r.mcore: r for r in active}
        plan: dict[str, tuple[str, str, tuple[str, ...]]] = {}
        for key in model_keys(model):
            if is_extra_state(key):
                continue
            found = split_layer_key(key)
            expert = split_expert_key(key)
            pattern = f"decoder.layers.{{i}}.{found[1]}" if found else key
            if expert:
                pattern = f"decoder.layers.{{i}}.mlp.experts.local_experts.{{e}}.{expert[2]}"
            row = by_pattern.get(pattern)
            if row is None:
                raise MappingError(f"model family {self.name!r} has no HF name for {pattern} (the model has a "
                                   f"feature this family does not support)")
            numbers = ({"i": found[0]} if found else {}) | ({"e": expert[1]} if expert else {})
            plan[key] = (row.rule, pattern, tuple(h.format(**numbers) for h in row.hf))
        return plan


def to_mcore(rule: str, tensors: list[np.ndarray], model: ModelConfig, key: str) -> np.ndarray | Rows:
    """HF tensors -> one Megatron tensor (a fused one as ``Rows`` of the HF tensors' row ranges: no copy)."""
    if rule == "copy":
        return tensors[0]
    if rule == "gate_up":
        gate, up = tensors
        if gate.shape != up.shape:
            raise MappingError(f"{key}: gate {tuple(gate.shape)} and up {tuple(up.shape)} differ in shape")
        return stack_rows([gate, up])
    if rule == "qkv":
        q, k, v = tensors
        groups, dim = model.num_query_groups, model.head_dim
        heads = model.numAttentionHeads
        expect = (heads * dim, groups * dim, groups * dim)
        if (q.shape[0], k.shape[0], v.shape[0]) != expect:
            raise MappingError(f"{key}: q/k/v have {q.shape[0]}/{k.shape[0]}/{v.shape[0]} rows, expected "
                               f"{expect[0]}/{expect[1]}/{expect[2]} ({heads} heads, {groups} query groups, "
                               f"head dim {dim})")
        rest = q.shape[1:]
        q, k, v = q.reshape(groups, heads // groups * dim, *rest), k.reshape(groups, dim, *rest), \
            v.reshape(groups, dim, *rest)
        return stack_rows([part for g in range(groups) for part in (q[g], k[g], v[g])])
    raise ValueError(f"unknown rule {rule!r}")


def to_hf(rule: str, tensor: np.ndarray | Rows, model: ModelConfig) -> list[np.ndarray]:
    """One Megatron tensor -> its HF tensors (inverse of ``to_mcore``)."""
    tensor = dense(tensor)
    if rule == "copy":
        return [tensor]
    if rule == "gate_up":
        return np.split(tensor, 2, axis=0)
    if rule == "qkv":
        groups, dim = model.num_query_groups, model.head_dim
        q_per_group = model.numAttentionHeads // groups * dim
        rest = tensor.shape[1:]
        q, k, v = np.split(tensor.reshape(groups, q_per_group + 2 * dim, *rest), [q_per_group, q_per_group + dim],
                           axis=1)
        return [t.reshape(-1, *rest) for t in (q, k, v)]
    raise ValueError(f"unknown rule {rule!r}")


_L, _M = "model.layers.{i}.", "decoder.layers.{i}."
_DECODER = (
    Row("embedding.word_embeddings.weight", ("model.embed_tokens.weight",)),
    Row(_M + "input_layernorm.weight", (_L + "input_layernorm.weight",)),
    Row(_M + "self_attention.linear_qkv.weight",
        (_L + "self_attn.q_proj.weight", _L + "self_attn.k_proj.weight", _L + "self_attn.v_proj.weight"), "qkv"),
    Row(_M + "self_attention.linear_proj.weight", (_L + "self_attn.o_proj.weight",)),
    Row(_M + "pre_mlp_layernorm.weight", (_L + "post_attention_layernorm.weight",)),
    Row(_M + "mlp.linear_fc1.weight", (_L + "mlp.gate_proj.weight", _L + "mlp.up_proj.weight"), "gate_up"),
    Row(_M + "mlp.linear_fc2.weight", (_L + "mlp.down_proj.weight",)),
    Row("decoder.final_layernorm.weight", ("model.norm.weight",)),
    Row("output_layer.weight", ("lm_head.weight",), when="untieEmbeddingsAndOutputWeights"),
    Row("score.weight", ("score.weight",), when="scoreHead"),
)
_QKV_BIAS = (
    Row(_M + "self_attention.linear_qkv.bias",
        (_L + "self_attn.q_proj.bias", _L + "self_attn.k_proj.bias", _L + "self_attn.v_proj.bias"), "qkv",
        when="addQkvBias"),
)
_QK_NORM = (
    Row(_M + "self_attention.q_layernorm.weight", (_L + "self_attn.q_norm.weight",), when="qkLayernorm"),
    Row(_M + "self_attention.k_layernorm.weight", (_L + "self_attn.k_norm.weight",), when="qkLayernorm"),
)

_ATTENTION = tuple(r for r in _DECODER if ".mlp." not in r.mcore)


def _moe_rows(block: str, router: str, gate: str, up: str, down: str) -> tuple[Row, ...]:
    """Router and routed experts of an HF sparse-MoE block (``block`` is its module name in the layer)."""
    expert, local = f"{_L}{block}.experts.{{e}}.", _M + "mlp.experts.local_experts.{e}."
    return (
        Row(_M + "mlp.router.weight", (f"{_L}{block}.{router}.weight",)),
        Row(local + "linear_fc1.weight", (f"{expert}{gate}.weight", f"{expert}{up}.weight"), "gate_up"),
        Row(local + "linear_fc2.weight", (f"{expert}{down}.weight",)),
    )


_QWEN_MOE = _moe_rows("mlp", "gate", "gate_proj", "up_proj", "down_proj")
_SHARED_EXPERT = (
    Row(_M + "mlp.shared_experts.linear_fc1.weight",
        (_L + "mlp.shared_expert.gate_proj.weight", _L + "mlp.shared_expert.up_proj.weight"), "gate_up"),
    Row(_M + "mlp.shared_experts.linear_fc2.weight", (_L + "mlp.shared_expert.down_proj.weight",)),
    Row(_M + "mlp.shared_experts.gate_weight", (_L + "mlp.shared_expert_gate.weight",), when="moeSharedExpertGate"),
)

FAMILIES = {
    "qwen3": Family("qwen3", "qwen3", "Qwen3ForCausalLM", _DECODER + _QK_NORM, "Qwen3ForSequenceClassification"),
    "qwen2": Family("qwen2", "qwen2", "Qwen2ForCausalLM", _DECODER + _QKV_BIAS, "Qwen2ForSequenceClassification"),
    # MindSpeed-LLM's recipes convert Qwen2.5 as "llama2 --add-qkv-bias": the bias rows keep that working.
    "llama2": Family("llama2", "llama", "LlamaForCausalLM", _DECODER + _QKV_BIAS, "LlamaForSequenceClassification"),
    "llama3": Family("llama3", "llama", "LlamaForCausalLM", _DECODER + _QKV_BIAS, "LlamaForSequenceClassification"),
    # Mixture of experts: megatron-core's TopKRouter + SequentialMLP experts (+ SharedExpertMLP).
    "qwen3_moe": Family("qwen3_moe", "qwen3_moe", "Qwen3MoeForCausalLM", _ATTENTION + _QK_NORM + _QWEN_MOE),
    "qwen2_moe": Family("qwen2_moe", "qwen2_moe", "Qwen2MoeForCausalLM",
                        _ATTENTION + _QKV_BIAS + _QWEN_MOE + _SHARED_EXPERT),
    "mixtral": Family("mixtral", "mixtral", "MixtralForCausalLM",
                      _ATTENTION + _moe_rows("block_sparse_moe", "gate", "w1", "w3", "w2")),
}
