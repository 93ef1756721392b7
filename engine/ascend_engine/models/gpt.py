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
from .cached_rotary import CachedRotarySelfAttention
from .sdpa_attention import SdpaDotProductAttention
from .sequence_parallel_norm import with_sequence_parallel_norms


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
        virtual_pipeline_model_parallel_size=(model.numLayers // (parallel.pipelineModelParallelSize
                                                                  * parallel.numLayersPerVirtualPipelineStage)
                                              if parallel.numLayersPerVirtualPipelineStage else None),
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
        mrope_section=[model.head_dim // 2] if token_positions and model.positionEmbeddingType == "rope" else None,
        expert_model_parallel_size=parallel.expertModelParallelSize,
        **moe_settings(model, variable_seq_lengths),
        **recompute,
    )


def moe_settings(model: ModelConfig, variable_seq_lengths: bool) -> dict:
    """TransformerConfig's MoE fields (megatron-core's TopKRouter, MoELayer and token dispatchers)."""
    if model.numExperts is None:
        # The dispatcher type is read even without experts; Megatron refuses allgather with variable lengths.
        return {"moe_token_dispatcher_type": "alltoall" if variable_seq_lengths else "allgather"}
    if model.moeGroupedGemm and applied_backend() == "cpu":
        raise ValueError("model.moeGroupedGemm (--moe-grouped-gemm) needs a GPU or NPU grouped GEMM kernel; "
                         "on CPU leave it off (experts then run one after another, same results)")
    return dict(
        num_moe_experts=model.numExperts,
        moe_router_topk=model.moeRouterTopk,
        moe_ffn_hidden_size=model.moe_ffn_hidden_size,
        moe_router_pre_softmax=model.moeRouterPreSoftmax,
        moe_aux_loss_coeff=model.moeAuxLossCoeff,
        moe_router_load_balancing_type=model.moeRouterLoadBalancingType,
        moe_z_loss_coeff=model.moeZLossCoeff,
        moe_token_dispatcher_type=model.moeTokenDispatcherType,
        moe_grouped_gemm=model.moeGroupedGemm,
        moe_shared_expert_intermediate_size=model.moeSharedExpertIntermediateSize,
        moe_shared_expert_gate=model.moeSharedExpertGate,
        moe_layer_freq=model.moeLayerFreq,
    )


def build_gpt_model(model: ModelConfig, parallel: ParallelConfig, seq_length: int,
                    params_dtype: torch.dtype = torch.float32, recompute_granularity: str | None = None,
                    seed: int | None = None, variable_seq_lengths: bool = False, token_positions: bool = False,
                    vp_stage: int | None = None, initialize: bool = True):
    """The current pipeline stage of the model (pre/post-process flags from Megatron's parallel state).

    With ``seed`` the weights come from ``init_layout_independent`` (the same model under any TP/PP layout)
    instead of Megatron's per-rank initialisation. ``variable_seq_lengths`` lets micro-batches differ in length
    (pipeline stages then exchange shapes first). ``token_positions`` makes RoPE read each token's position from
    ``position_ids`` (packed samples restart at 0) instead of assuming 0..s-1; see ``rope_positions``.
    ``vp_stage`` picks this rank's model chunk under virtual pipeline stages. ``initialize=False`` leaves the
    weights uninitialised, for a caller that loads every one of them from a checkpoint right after.
    """
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec

    # Megatron still initialises (with CPU initialisation it sets the tensor-parallel attributes, which grad-norm
    # and our re-initialisation rely on, only while initialising).
    config = transformer_config(model, parallel, params_dtype, recompute_granularity, variable_seq_lengths,
                                token_positions)
    config.perform_initialization = initialize
    if model.numExperts is None and not parallel.sequenceParallel:
        spec = get_gpt_layer_local_spec(qk_layernorm=model.qkLayernorm, normalization=model.normalization)
        spec.submodules.self_attention.module = CachedRotarySelfAttention
        spec.submodules.self_attention.submodules.core_attention = SdpaDotProductAttention
    else:
        # Per-layer specs (MoE or dense by moe_layer_freq) for this pipeline stage: SequentialMLP experts
        # (or grouped GEMM) behind megatron-core's TopKRouter and token dispatcher; the block form also names
        # the final norm, so sequence parallelism can swap every torch norm for one it supports.
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization=model.normalization,
                                          vp_stage=vp_stage)
        if parallel.sequenceParallel:
            spec = with_sequence_parallel_norms(spec)
    gpt = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=model.padded_vocab_size(parallel.tensorModelParallelSize),
        max_sequence_length=model.maxPositionEmbeddings or seq_length,
        pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
        post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
        # a reward model has no LM output layer, so nothing to tie to the embedding
        share_embeddings_and_output_weights=not model.untieEmbeddingsAndOutputWeights and not model.scoreHead,
        position_embedding_type="mrope" if config.mrope_section else model.positionEmbeddingType,
        rotary_base=int(model.rotaryBase),
        vp_stage=vp_stage,
    )
    if model.scoreHead and gpt.post_process:
        from .score_head import attach_score_head

        attach_score_head(gpt)
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
