"""Megatron-core's ``SelfAttention`` with keys stored in the static KV cache already rotated.

With a ``StaticInferenceContext`` megatron-core stores each new key as projected and rotates the whole cache,
``[0, sequence_end)``, again at every decode step in every layer: work that grows with the length generated so far
and, on CPU at evaluation sizes, rivals the step's matrix products. Rotary embedding is per position, so rotating
a key once, when it enters the cache, gives the very same numbers; the query is still rotated at its own position.
Every other context (training, dynamic batching, flash decoding) takes megatron-core's path unchanged.

With a ``RaggedKVCache`` (rows at positions of their own) the rotation uses each row's positions, the keys and
values are written at those positions, and a decode step attends to the cache under the mask the model was given.
"""
from __future__ import annotations

from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb
from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import (
    _yarn_get_concentration_factor_from_config,
)
from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.enums import AttnMaskType

from .ragged_cache import RaggedKVCache


class CachedRotarySelfAttention(SelfAttention):
    def _adjust_key_value_for_inference(self, inference_context, query, key, value, rotary_pos_emb, *args,
                                        **kwargs):
        if isinstance(inference_context, RaggedKVCache):
            return self._adjust_for_ragged_cache(inference_context, query, key, value, rotary_pos_emb)
        static = (inference_context is not None and inference_context.is_static_batching()
                  and isinstance(rotary_pos_emb, tuple) and rotary_pos_emb[1] is not None
                  and not self.config.flash_decode)
        if static:
            start = inference_context.sequence_len_offset
            key = apply_rotary_pos_emb(key, rotary_pos_emb[1][start:start + key.size(0)], config=self.config,
                                       mscale=_yarn_get_concentration_factor_from_config(self.config),
                                       cp_group=self.pg_collection.cp)
        query, key, value, rotary_pos_emb, mask_type, table = super()._adjust_key_value_for_inference(
            inference_context, query, key, value, rotary_pos_emb, *args, **kwargs)
        if static:
            rotary_pos_emb = (rotary_pos_emb[0], None)  # the cached keys carry their rotation already
        return query, key, value, rotary_pos_emb, mask_type, table

    def _rotate(self, t, table, positions):
        """``t`` [s, b, heads, dim] rotated at ``positions`` [s, b] (a row of the table per token)."""
        return apply_rotary_pos_emb(t, table[positions].squeeze(2), config=self.config,
                                    mscale=_yarn_get_concentration_factor_from_config(self.config),
                                    cp_group=self.pg_collection.cp)

    def _adjust_for_ragged_cache(self, cache: RaggedKVCache, query, key, value, rotary_pos_emb):
        positions = cache.positions.t()  # [s, b]
        if rotary_pos_emb is not None:
            q_table, k_table = rotary_pos_emb if isinstance(rotary_pos_emb, tuple) else (rotary_pos_emb,) * 2
            query, key = self._rotate(query, q_table, positions), self._rotate(key, k_table, positions)
        key_memory, value_memory = cache.memory(self.layer_number, key, value)
        rows = cache.rows.unsqueeze(0).expand_as(positions)
        key_memory[positions, rows] = key
        value_memory[positions, rows] = value
        if not cache.is_decode_only() and not cache.past:  # a prompt from position 0: its own keys are the past
            return query, key, value, None, self.attn_mask_type, None
        if not cache.is_decode_only():  # a chunk after a cached prefix: causal over prefix and chunk
            n = positions.shape[1]
            return (query, key_memory[:cache.kv_length, :n], value_memory[:cache.kv_length, :n], None,
                    AttnMaskType.causal, None)
        n = positions.shape[1]
        return (query, key_memory[:cache.kv_length, :n], value_memory[:cache.kv_length, :n], None,
                AttnMaskType.no_mask, None)
