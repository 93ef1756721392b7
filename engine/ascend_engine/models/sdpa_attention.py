"""Megatron-core's local ``DotProductAttention`` computed by ``torch.nn.functional.scaled_dot_product_attention``.

The local attention (the one megatron-core offers without Transformer Engine, i.e. on CPU and on devices TE does
not support) materialises the [b, heads, sq, sk] scores, masks them with a freshly built triangle, soft-maxes and
multiplies again; SDPA runs the same arithmetic as one fused (flash, on CPU too) kernel. It is also the only one
of the two that attends a chunk of queries to a longer cached past (sq < sk: the causal triangle aligned to the
last query), which chunked prefill and a reused prompt prefix need; the local one asserts sq == sk.

A boolean mask (True: hidden) is taken at inference, where it marks the cache positions a row has not reached
(``RaggedKVCache``). Cases SDPA does not express the same way (any other mask, training-time attention dropout, sliding
windows, learnable softmax offsets, query-key layer scaling) fall back to megatron-core's own computation.
"""
from __future__ import annotations

import torch
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType


def cached_attention(query, key, value, hidden, scale: float):
    """Attention of ``query`` [b, heads, s, dim] (``s`` new tokens per row) against a row's cached ``key`` and
    ``value`` [b, groups, keys, dim] under ``hidden`` [b or 1, 1, s, keys] (True: a key the query does not see)
    -> [b, heads, s, dim], by SDPA (one fused call; for a decode step's single query, two batched products and a
    softmax measured the same on CPU, benchmarks/decode_step_levers.py, and are more launches on a GPU)."""
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=~hidden, scale=scale,
                                                            enable_gqa=query.shape[1] != key.shape[1])


class SdpaDotProductAttention(DotProductAttention):
    def _falls_back(self, attention_mask, attention_bias, packed_seq_params) -> bool:
        cfg = self.config
        explicit = attention_mask is not None and (self.training or attention_mask.dtype != torch.bool)
        return (explicit or attention_bias is not None or packed_seq_params is not None
                or self.softmax_offset is not None or getattr(cfg, "window_size", None) is not None
                or cfg.apply_query_key_layer_scaling or (self.training and self.attention_dropout.p > 0))

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        if self._falls_back(attention_mask, attention_bias, packed_seq_params):
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias,
                                   packed_seq_params)
        # A GPT layer's own type decides: megatron-core's static KV cache passes ``no_mask`` for every call after
        # the first, but a chunk of several queries against the cache still needs its triangle.
        mask_type = self.attn_mask_type if self.attn_mask_type == AttnMaskType.causal else attn_mask_type
        sq, b, heads, _ = query.shape
        sk = key.shape[0]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [s, b, h, d] -> [b, h, s, d]
        causal, mask = False, None
        if attention_mask is not None:
            mask = ~attention_mask
        elif mask_type == AttnMaskType.causal and sq > 1:
            if sq == sk:
                causal = True
            else:  # queries are the last sq of sk positions
                mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(diagonal=sk - sq)
        elif mask_type not in (AttnMaskType.causal, AttnMaskType.no_mask):
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias,
                                   packed_seq_params)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                               scale=self.softmax_scale,
                                                               enable_gqa=key.shape[2] != heads)
        return out.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)
