"""The ``args`` namespace stored in every checkpoint, under Megatron-LM's own attribute names.

Megatron-LM, MindSpeed-LLM and their converters read the model shape and parallel layout from it.
"""
from __future__ import annotations

import argparse

from ..config.train import TrainConfig


def megatron_args(cfg: TrainConfig, world_size: int, iteration: int, consumed_train_samples: int) -> argparse.Namespace:
    m, p, t, o = cfg.model, cfg.parallel, cfg.training, cfg.optimizer
    tp, pp = p.tensorModelParallelSize, p.pipelineModelParallelSize
    return argparse.Namespace(
        num_layers=m.numLayers, hidden_size=m.hiddenSize, ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.numAttentionHeads, group_query_attention=m.groupQueryAttention,
        num_query_groups=m.num_query_groups, kv_channels=m.head_dim,
        max_position_embeddings=m.maxPositionEmbeddings or t.seqLength, seq_length=t.seqLength,
        vocab_size=m.vocabSize, padded_vocab_size=m.padded_vocab_size(tp),
        make_vocab_size_divisible_by=m.makeVocabSizeDivisibleBy,
        normalization=m.normalization, norm_epsilon=m.normEpsilon, swiglu=m.swiglu,
        position_embedding_type=m.positionEmbeddingType, rotary_base=m.rotaryBase, qk_layernorm=m.qkLayernorm,
        add_qkv_bias=m.addQkvBias, add_bias_linear=m.addBiasLinear,
        untie_embeddings_and_output_weights=m.untieEmbeddingsAndOutputWeights,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=None, world_size=world_size, data_parallel_size=world_size // (tp * pp),
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
