"""Megatron's optimizer (Adam(W)/SGD, grad clipping, fp16 loss scaling) and its LR/WD scheduler from our config."""
from __future__ import annotations

import torch

from ..config.train import TrainConfig


def warmup_iters(cfg: TrainConfig) -> int:
    o = cfg.optimizer
    if o.lrWarmupFraction is not None:
        return int(o.lrWarmupFraction * cfg.training.trainIters)
    return o.lrWarmupIters


def build_optimizer(cfg: TrainConfig, model_chunks: list, params_dtype: torch.dtype):
    """Megatron's optimizer over the DDP-wrapped chunks and a scheduler stepped once per iteration."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    o = cfg.optimizer
    config = OptimizerConfig(
        optimizer=o.optimizer, lr=o.lr, min_lr=o.minLr, weight_decay=o.weightDecay,
        adam_beta1=o.adamBeta1, adam_beta2=o.adamBeta2, adam_eps=o.adamEps, clip_grad=o.clipGrad,
        bf16=params_dtype == torch.bfloat16, fp16=params_dtype == torch.float16, params_dtype=params_dtype,
        use_distributed_optimizer=cfg.parallel.useDistributedOptimizer,
        # fp16: dynamic loss scaling as Megatron-LM does by default (initial 2**32 is too high for tiny models).
        initial_loss_scale=2.0 ** 16,
    )
    optimizer = get_megatron_optimizer(config, model_chunks)
    return optimizer, build_scheduler(cfg, optimizer)


def build_scheduler(cfg: TrainConfig, optimizer):
    """megatron-core's LR/WD scheduler over ``optimizer``'s param groups (any torch optimizer will do)."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    o = cfg.optimizer
    iters = cfg.training.trainIters
    warmup = warmup_iters(cfg)
    return OptimizerParamScheduler(
        optimizer, init_lr=0.0 if warmup else o.lr, max_lr=o.lr, min_lr=o.minLr,
        lr_warmup_steps=warmup, lr_decay_steps=iters, lr_decay_style=o.lrDecayStyle,
        start_wd=o.weightDecay, end_wd=o.weightDecay, wd_incr_steps=iters, wd_incr_style="constant",
        # Megatron-LM's defaults (megatron-core's own default silently keeps the checkpoint's schedule);
        # checkpoint.training refuses a differing schedule before either applies.
        override_opt_param_scheduler=o.overrideOptParamScheduler,
        use_checkpoint_opt_param_scheduler=o.useCheckpointOptParamScheduler,
    )
