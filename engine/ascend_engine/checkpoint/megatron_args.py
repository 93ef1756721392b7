"""The ``args`` namespace stored in every checkpoint, under Megatron-LM's own attribute names.

Megatron-LM, MindSpeed-LLM and their converters read the model shape and parallel layout from it.
"""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..config.model import ModelConfig

if TYPE_CHECKING:  # only annotations: a conversion never builds the training configs
    from ..config.train import TrainConfig

# ModelConfig's MoE fields under Megatron-LM's args names (MindSpeed-LLM reads the same).
_MOE_ARGS = {
    "num_experts": "numExperts", "moe_router_topk": "moeRouterTopk", "moe_ffn_hidden_size": "moeFfnHiddenSize",
    "moe_router_pre_softmax": "moeRouterPreSoftmax", "moe_aux_loss_coeff": "moeAuxLossCoeff",
    "moe_router_load_balancing_type": "moeRouterLoadBalancingType", "moe_z_loss_coeff": "moeZLossCoeff",
    "moe_token_dispatcher_type": "moeTokenDispatcherType", "moe_grouped_gemm": "moeGroupedGemm",
    "moe_shared_expert_intermediate_size": "moeSharedExpertIntermediateSize",
    "moe_shared_expert_gate": "moeSharedExpertGate", "moe_layer_freq": "moeLayerFreq",
}


def moe_args(model: ModelConfig) -> dict:
    """The MoE part of a checkpoint's args (num_experts None for a dense model)."""
    return {arg: getattr(model, field) for arg, field in _MOE_ARGS.items()}


def moe_fields_from_args(args: argparse.Namespace) -> dict:
    """ModelConfig fields from a checkpoint's args; absent or None args keep ModelConfig's defaults."""
    return {field: getattr(args, arg) for arg, field in _MOE_ARGS.items() if getattr(args, arg, None) is not None}


def megatron_args(cfg: TrainConfig, world_size: int, iteration: int, consumed_train_samples: int) -> argparse.Namespace:
    m, p, t, o = cfg.model, cfg.parallel, cfg.training, cfg.optimizer
    tp, pp = p.tensorModelParallelSize, p.pipelineModelParallelSize
    return argparse.Namespace(
        **moe_args(m), expert_model_parallel_size=p.expertModelParallelSize,
        num_layers=m.numLayers, hidden_size=m.hiddenSize, ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.numAttentionHeads, group_query_attention=m.groupQueryAttention,
        num_query_groups=m.num_query_groups, kv_channels=m.head_dim,
        max_position_embeddings=m.maxPositionEmbeddings or t.seqLength, seq_length=t.seqLength,
        vocab_size=m.vocabSize, padded_vocab_size=m.padded_vocab_size(tp),
        make_vocab_size_divisible_by=m.makeVocabSizeDivisibleBy,
        normalization=m.normalization, norm_epsilon=m.normEpsilon, swiglu=m.swiglu,
        position_embedding_type=m.positionEmbeddingType, rotary_base=m.rotaryBase, qk_layernorm=m.qkLayernorm,
        add_qkv_bias=m.addQkvBias, add_bias_linear=m.addBiasLinear,
        untie_embeddings_and_output_weights=m.untieEmbeddingsAndOutputWeights, score_head=m.scoreHead,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=cfg.virtual_pipeline_size,
        num_layers_per_virtual_pipeline_stage=p.numLayersPerVirtualPipelineStage, world_size=world_size, data_parallel_size=world_size // (tp * pp),
        use_distributed_optimizer=p.useDistributedOptimizer, sequence_parallel=p.sequenceParallel,
        micro_batch_size=t.microBatchSize, global_batch_size=t.globalBatchSize, train_iters=t.trainIters,
        seed=t.seed, bf16=t.precision == "bf16", fp16=t.precision == "fp16",
        optimizer=o.optimizer, lr=o.lr, min_lr=o.minLr, lr_decay_style=o.lrDecayStyle, weight_decay=o.weightDecay,
        clip_grad=o.clipGrad, adam_beta1=o.adamBeta1, adam_beta2=o.adamBeta2, adam_eps=o.adamEps,
        transformer_impl="local", iteration=iteration, consumed_train_samples=consumed_train_samples,
        consumed_valid_samples=0,
        lora_r=cfg.lora.loraR, lora_alpha=cfg.lora.loraAlpha, lora_dropout=cfg.lora.loraDropout,
        lora_target_modules=list(cfg.lora.loraTargetModules),
    )
