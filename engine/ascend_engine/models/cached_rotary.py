"""Megatron-core's ``SelfAttention`` with keys stored in the static KV cache already rotated.

With a ``StaticInferenceContext`` megatron-core stores each new key as projected and rotates the whole cache,
``[0, sequence_end)``, again at every decode step in every layer: work that grows with the length generated so far
and, on CPU at evaluation sizes, rivals the step's matrix products. Rotary embedding is per position, so rotating
a key once, when it enters the cache, gives the very same numbers; the query is still rotated at its own position.
Every other context (training, dynamic batching, flash decoding) takes megatron-core's path unchanged.
"""
from __future__ import annotations

from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb
from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import (
    _yarn_get_concentration_factor_from_config,
)
from megatron.core.transformer.attention import SelfAttention


class CachedRotarySelfAttention(SelfAttention):
    def _adjust_key_value_for_inference(self, inference_context, query, key, value, rotary_pos_emb, *args,
                                        **kwargs):
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
