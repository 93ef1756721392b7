"""What a training checkpoint holds (model, optimizer, scheduler, RNG, data position) and how it is restored."""
from __future__ import annotations

import random

import numpy as np
import torch

from .megatron_args import megatron_args
from .save import save_checkpoint


def rng_state() -> dict:
    """This rank's generators, under Megatron-LM's keys."""
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    return {"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
            "torch_rng_state": torch.get_rng_state(), "cuda_rng_state": torch.cuda.get_rng_state(),
            "rng_tracker_states": get_cuda_rng_tracker().get_states()}


def _gather_over_dp(obj) -> list:
    """One entry per data-parallel rank (Megatron-LM stores rng_state that way)."""
    from megatron.core import parallel_state

    if not torch.distributed.is_initialized():
        return [obj]
    group = parallel_state.get_data_parallel_group()
    out = [None] * torch.distributed.get_world_size(group)
    torch.distributed.all_gather_object(out, obj, group=group)
    return out


def save_training_checkpoint(trainer):
    """Collective. One file per model-parallel rank, written by data-parallel rank 0 of each."""
    from ..train.loop import unwrap

    cfg, info = trainer.cfg, trainer.info
    rngs = _gather_over_dp(rng_state())
    state = None
    if info.dp_rank == 0:
        state = {
            "args": megatron_args(cfg, info.world_size, trainer.iteration, trainer.consumed),
            "model": unwrap(trainer.model).state_dict_for_save_checkpoint(),
            "optimizer": trainer.optimizer.state_dict(),
            "opt_param_scheduler": trainer.scheduler.state_dict(),
            "rng_state": rngs,
        }
    return save_checkpoint(cfg.checkpoint.save, trainer.iteration, state, info.tp_rank, info.pp_rank, info.pp,
                           is_rank0=info.rank == 0)
