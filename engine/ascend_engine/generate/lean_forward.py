"""A forward of a few tokens per row against the ``RaggedKVCache``, computed straight from a dense model's weights:
a prompt's prefill, a decode step (one token per row) and choice scoring's chunk after a cached prefix.

Going through megatron-core's modules, a decode step of 16 rows through 8 layers of hidden 512 spends as much time
in module calls, autograd-free wrappers, per-layer rotary tables and the CPU flash kernel's set-up for a single
query as in its products, and on a GPU those host steps are what a forward of a small model waits on. This
forward reads the same parameters and runs the same arithmetic per layer (norm, fused QKV, rotary at each token's
position, cache write, attention over the row's cached past, output projection, residual, norm, MLP, residual),
then the final norm and the output layer, with:

- rotary cos/sin looked up once per forward for all layers, from tables made once;
- attention in one SDPA call over the row's cached keys (``cached_attention``), without the module's reshapes
  and mask building;
- the last layer's MLP, the final norm and the output layer only at the positions read (each row's last token,
  or the positions scoring asks for): nothing after the last attention mixes positions;
- every product in the kernel the device runs a few rows by a large weight fastest with (the table of
  ``inference_linears.packed_products``, which the model's own linears use during inference too: oneDNN on a
  packed copy on CPU, the plain product elsewhere); the sums may differ from megatron-core's in the last bits,
  within the tolerance parity rule (docs/performance.md, Inference).

It applies where that arithmetic is all there is: one tensor-parallel rank and one pipeline stage, the local
dense layer spec (``CachedRotarySelfAttention`` + ``SdpaDotProductAttention``, a plain ``MLP``), rotary (whole
head, not interleaved) or learned positions, no hooks or per-instance overrides on any module (LoRA adapters).
Anything else takes the model's own forward (``fits`` says which).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..models.sdpa_attention import cached_attention


def _biased(product, bias):
    return product if bias is None else (lambda x: product(x) + bias)


def _hooked(module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or "forward" in vars(module)
                or "_forward_mlp" in vars(module))


def fits(gpt) -> bool:
    """Whether ``LeanForward`` computes this model's forward against the cache (else the model's own does)."""
    from megatron.core import parallel_state
    from megatron.core.transformer.mlp import MLP
    from megatron.core.transformer.transformer_layer import TransformerLayer

    from ..models.cached_rotary import CachedRotarySelfAttention
    from ..models.sdpa_attention import SdpaDotProductAttention

    if parallel_state.get_tensor_model_parallel_world_size() != 1:
        return False
    if parallel_state.get_pipeline_model_parallel_world_size() != 1:
        return False
    cfg = getattr(gpt, "config", None)
    if cfg is None or not (getattr(gpt, "pre_process", False) and getattr(gpt, "post_process", False)):
        return False
    if getattr(gpt, "position_embedding_type", None) not in ("rope", "learned_absolute"):
        return False
    if (cfg.sequence_parallel or cfg.fp32_residual_connection or cfg.apply_residual_connection_post_layernorm
            or getattr(cfg, "mtp_num_layers", None) or cfg.rotary_interleaved or cfg.num_moe_experts
            or getattr(cfg, "attention_output_gate", False) or cfg.activation_func_clamp_value is not None
            or cfg.glu_linear_offset != 0.0 or getattr(cfg, "window_size", None) is not None
            or cfg.apply_query_key_layer_scaling or getattr(cfg, "context_parallel_size", 1) != 1):
        return False
    if gpt.position_embedding_type == "rope":
        from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import (
            _yarn_get_concentration_factor_from_config,
        )

        inv_freq = getattr(getattr(gpt, "rotary_pos_emb", None), "inv_freq", None)
        if (inv_freq is None or inv_freq.numel() * 2 != cfg.kv_channels
                or _yarn_get_concentration_factor_from_config(cfg) != 1.0):
            return False
    if any(_hooked(m) for m in gpt.modules()):
        return False
    layers = getattr(getattr(gpt, "decoder", None), "layers", None)
    if not layers or getattr(gpt.decoder, "final_layernorm", None) is None:
        return False
    for layer in layers:
        if type(layer) is not TransformerLayer or type(layer.mlp) is not MLP:
            return False
        attention = layer.self_attention
        if type(attention) is not CachedRotarySelfAttention:
            return False
        core = attention.core_attention
        if type(core) is not SdpaDotProductAttention or core.softmax_offset is not None:
            return False
        if cfg.gated_linear_unit and cfg.activation_func is not F.silu and cfg.activation_func is not F.gelu:
            return False
    return True


class LeanForward:
    """Built once per generation or evaluation (it holds the rotary tables up to ``length`` positions)."""

    def __init__(self, gpt, length: int, products: dict):
        self.gpt, self.cfg = gpt, gpt.config
        layer = gpt.decoder.layers[0].self_attention
        self.heads = layer.num_attention_heads_per_partition
        self.groups = layer.num_query_groups_per_partition
        self.head_dim = layer.hidden_size_per_attention_head
        self.scale = layer.core_attention.softmax_scale
        self.cos = self.sin = None
        if gpt.position_embedding_type == "rope":
            freqs = gpt.rotary_pos_emb(length)  # [length, 1, 1, head_dim]
            freqs = freqs.reshape(freqs.shape[0], 1, freqs.shape[-1]).float()
            self.cos, self.sin = freqs.cos(), freqs.sin()  # [length, 1, head_dim]
        output = gpt.output_layer
        linears = [(m.weight, m.bias) for layer in gpt.decoder.layers
                   for m in (layer.self_attention.linear_qkv, layer.self_attention.linear_proj, layer.mlp.linear_fc1,
                             layer.mlp.linear_fc2)]
        linears.append((output.weight if output.weight is not None else gpt.shared_embedding_or_output_weight(),
                        None))
        products = [_biased(products[id(w)], b) for w, b in linears]  # ``inference_linears.packed_products``
        self.layer_products = [products[i:i + 4] for i in range(0, len(products) - 1, 4)]
        self.output_product = products[-1]

    def _rotate(self, t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = t.shape[-1] // 2
        rotated = torch.cat((-t[..., half:], t[..., :half]), dim=-1)
        return t * cos + rotated * sin

    def _mlp(self, layer, hidden: torch.Tensor, fc1_product, fc2_product) -> torch.Tensor:
        x = fc1_product(layer.pre_mlp_layernorm(hidden).view(-1, hidden.shape[-1]))
        if self.cfg.gated_linear_unit:
            gate, up = torch.chunk(x, 2, dim=-1)
            x = self.cfg.activation_func(gate) * up
        else:
            x = self.cfg.activation_func(x)
        return hidden + fc2_product(x).view(hidden.shape)

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache,
                 read: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """``tokens`` [n, s] (or [n] for one each) at ``positions`` of the same shape, under ``mask``
        [n or 1, 1, s, keys] (True: a key the token does not see; the cache's ``prefill``, ``extend`` and
        ``decode`` return it) -> logits [k, padded vocabulary] after the tokens at (row, column) pairs ``read``
        (two [k] tensors), by default after each row's last token ([n, ...]). Their keys and values enter the
        cache at their positions: in the slots ``prefill`` named, else in slots 0..n-1. With ``cache`` None the
        rows are whole texts from position 0 (``mask``: ``RaggedKVCache.causal_mask(0, s, ...)``), attending to
        their own keys, which nothing keeps."""
        gpt = self.gpt
        if tokens.dim() == 1:
            tokens, positions = tokens.unsqueeze(1), positions.unsqueeze(1)
        (n, s), dim, groups = tokens.shape, self.head_dim, self.groups
        per_group = self.heads // groups
        embedding = gpt.embedding
        hidden = embedding.word_embeddings.weight[tokens]  # [n, s, hidden]
        if embedding.add_position_embedding:
            hidden = hidden + embedding.position_embeddings.weight[positions]
        cos = sin = None
        if self.cos is not None:
            cos, sin = self.cos[positions].to(hidden.dtype), self.sin[positions].to(hidden.dtype)  # [n, s, 1, dim]
        # a prompt from position 0 (``cache.prefill``: into any slots) attends to its own new keys alone; other
        # tokens to the past in slots 0..n-1 (made here, not read from the cache: a captured graph keeps it)
        fresh = cache is None or (not cache.is_decode_only() and not cache.past)
        rows = None if cache is None else (cache.rows if fresh else torch.arange(n, device=tokens.device)).unsqueeze(1)
        keys = mask.shape[-1]
        layers = list(zip(gpt.decoder.layers, self.layer_products))
        for index, (layer, (qkv_product, proj_product, fc1_product, fc2_product)) in enumerate(layers):
            attention = layer.self_attention
            x = layer.input_layernorm(hidden)
            qkv = qkv_product(x.view(n * s, -1)).view(n, s, groups, (per_group + 2) * dim)
            query, key, value = qkv.split([per_group * dim, dim, dim], dim=-1)
            query = query.reshape(n, s, self.heads, dim)
            if attention.q_layernorm is not None:
                query = attention.q_layernorm(query)
            if attention.k_layernorm is not None:
                key = attention.k_layernorm(key)
            if cos is not None:
                query, key = self._rotate(query, cos, sin), self._rotate(key, cos, sin)
            if cache is not None:
                key_memory, value_memory = cache.memory(attention.layer_number, key.transpose(0, 1),
                                                        value.transpose(0, 1))
                key_memory[positions, rows] = key
                value_memory[positions, rows] = value
            if fresh:
                past_keys, past_values = key.transpose(1, 2), value.transpose(1, 2)
            else:  # [positions, slots, groups, dim] views of [slots, groups, positions, dim] buffers
                past_keys = key_memory[:keys, :n].permute(1, 2, 0, 3)
                past_values = value_memory[:keys, :n].permute(1, 2, 0, 3)
            context = cached_attention(query.transpose(1, 2), past_keys, past_values, mask, self.scale)
            hidden = hidden + proj_product(context.transpose(1, 2).reshape(n * s, -1)).view(n, s, -1)
            if index == len(layers) - 1:  # nothing after the last attention mixes positions: read first
                hidden = hidden[:, -1] if read is None else hidden[read]
            hidden = self._mlp(layer, hidden, fc1_product, fc2_product)
        return self.output_product(gpt.decoder.final_layernorm(hidden))
