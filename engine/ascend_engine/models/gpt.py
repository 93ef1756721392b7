"""Megatron-core GPTModel from our ModelConfig, with the local (non-TransformerEngine) layer spec.

The local spec is what MindSpeed-LLM uses with ``--transformer-impl local``, so state-dict keys match its
checkpoints (``decoder.layers.0.self_attention.linear_qkv.weight``, ``input_layernorm.weight``, ...).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config.train import ModelConfig, ParallelConfig
from ..device import applied_backend
from .init import init_layout_independent


def transformer_config(model: ModelConfig, parallel: ParallelConfig, params_dtype: torch.dtype = torch.float32,
                       recompute_granularity: str | None = None, variable_seq_lengths: bool = False,
                       token_positions: bool = False):
    from megatron.core.transformer import TransformerConfig

    recompute = {}
    if recompute_granularity == "full":
        recompute = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    elif recompute_granularity == "selective":
        recompute = dict(recompute_granularity="selective")
    return TransformerConfig(
        num_layers=model.numLayers,
        hidden_size=model.hiddenSize,
        ffn_hidden_size=model.ffn_hidden_size,
        num_attention_heads=model.numAttentionHeads,
        num_query_groups=model.num_query_groups,
        kv_channels=model.head_dim,
        normalization=model.normalization,
        layernorm_epsilon=model.normEpsilon,
        gated_linear_unit=model.swiglu,
        activation_func=F.silu if model.swiglu else F.gelu,
        qk_layernorm=model.qkLayernorm,
        add_bias_linear=model.addBiasLinear,
        add_qkv_bias=model.addQkvBias or model.addBiasLinear,
        attention_dropout=model.attentionDropout,
        hidden_dropout=model.hiddenDropout,
        init_method_std=model.initMethodStd,
        tensor_model_parallel_size=parallel.tensorModelParallelSize,
        pipeline_model_parallel_size=parallel.pipelineModelParallelSize,
        sequence_parallel=parallel.sequenceParallel,
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16,
        use_cpu_initialization=applied_backend() == "cpu",
        gradient_accumulation_fusion=False,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        deallocate_pipeline_outputs=True,
        attention_softmax_in_fp32=True,
        variable_seq_lengths=variable_seq_lengths,
        # Megatron refuses variable lengths with the (MoE-only) allgather dispatcher; these models have no MoE.
        moe_token_dispatcher_type="alltoall" if variable_seq_lengths else "allgather",
        mrope_section=[model.head_dim // 2] if token_positions and model.positionEmbeddingType == "rope" else None,
        **recompute,
    )


def build_gpt_model(model: ModelConfig, parallel: ParallelConfig, seq_length: int,
                    params_dtype: torch.dtype = torch.float32, recompute_granularity: str | None = None,
                    seed: int | None = None, variable_seq_lengths: bool = False, token_positions: bool = False):
    """The current pipeline stage of the model (pre/post-process flags from Megatron's parallel state).

    With ``seed`` the weights come from ``init_layout_independent`` (the same model under any TP/PP layout)
    instead of Megatron's per-rank initialisation. ``variable_seq_lengths`` lets micro-batches differ in length
    (pipeline stages then exchange shapes first). ``token_positions`` makes RoPE read each token's position from
    ``position_ids`` (packed samples restart at 0) instead of assuming 0..s-1; see ``rope_positions``.
    """
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    # Megatron still initialises (with CPU initialisation it sets the tensor-parallel attributes, which grad-norm
    # and our re-initialisation rely on, only while initialising).
    config = transformer_config(model, parallel, params_dtype, recompute_granularity, variable_seq_lengths,
                                token_positions)
    spec = get_gpt_layer_local_spec(qk_layernorm=model.qkLayernorm, normalization=model.normalization)
    gpt = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=model.padded_vocab_size(parallel.tensorModelParallelSize),
        max_sequence_length=model.maxPositionEmbeddings or seq_length,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=not model.untieEmbeddingsAndOutputWeights,
        position_embedding_type="mrope" if config.mrope_section else model.positionEmbeddingType,
        rotary_base=int(model.rotaryBase),
    )
    if seed is not None:
        init_layout_independent(gpt, model, seed, parallel.tensorModelParallelSize,
                                parallel_state.get_tensor_model_parallel_rank())
    return gpt


def rope_positions(gpt, position_ids: torch.Tensor) -> torch.Tensor:
    """``position_ids`` [b, s] in the form the model reads them.

    Megatron's plain RoPE ignores ``position_ids`` (it rotates by 0..s-1). Its multimodal RoPE takes explicit
    positions per token as [3, b, s] (temporal, height, width); with one section covering every rotary channel
    and the same positions in all three rows it is plain RoPE at the given positions, bit for bit.
    """
    if getattr(gpt, "position_embedding_type", None) == "mrope":
        return position_ids.unsqueeze(0).expand(3, -1, -1)
    return position_ids
