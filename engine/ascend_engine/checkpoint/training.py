"""What a training checkpoint holds (model, optimizer, scheduler, RNG, data position) and how it is restored.

The file is Megatron-LM's: ``model``, ``args``, ``optimizer``, ``opt_param_scheduler``, ``rng_state`` (one entry
per data-parallel rank), ``iteration``; the distributed optimizer's sharded state goes to ``distrib_optim.pt``
next to it, as Megatron-LM's legacy torch format does.
"""
from __future__ import annotations

import random
import sys

import numpy as np
import torch

from .layout import RELEASE, checkpoint_dir, read_latest
from .megatron_args import megatron_args
from .save import save_checkpoint

MODEL_FILE = "model_optim_rng.pt"
DISTRIB_OPTIM_FILE = "distrib_optim.pt"


class CheckpointMismatch(ValueError):
    """A checkpoint that cannot be loaded into this run; the message says what differs and what to do."""


def rng_state() -> dict:
    """This rank's generators, under Megatron-LM's keys."""
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    return {"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
            "torch_rng_state": torch.get_rng_state(), "cuda_rng_state": torch.cuda.get_rng_state(),
            "rng_tracker_states": get_cuda_rng_tracker().get_states()}


def set_rng_state(state: dict) -> None:
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    random.setstate(state["random_rng_state"])
    np.random.set_state(state["np_rng_state"])
    torch.set_rng_state(state["torch_rng_state"])
    torch.cuda.set_rng_state(state["cuda_rng_state"])
    get_cuda_rng_tracker().set_states(state["rng_tracker_states"])


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
    distributed = cfg.parallel.useDistributedOptimizer
    state = None
    if info.dp_rank == 0:
        state = {
            "args": megatron_args(cfg, info.world_size, trainer.iteration, trainer.consumed),
            "model": unwrap(trainer.model).state_dict_for_save_checkpoint(),
            "optimizer": trainer.optimizer.state_dict(),
            "opt_param_scheduler": trainer.scheduler.state_dict(),
            "rng_state": rngs,
        }

    def write_optimizer_shards(rank_dir):
        trainer.optimizer.save_parameter_state(str(rank_dir / DISTRIB_OPTIM_FILE))

    return save_checkpoint(cfg.checkpoint.save, trainer.iteration, state, info.tp_rank, info.pp_rank, info.pp,
                           is_rank0=info.rank == 0, write_collective=write_optimizer_shards if distributed else None)


def _check_layout(args, cfg, where) -> None:
    p = cfg.parallel
    for name, ours in (("tensor_model_parallel_size", p.tensorModelParallelSize),
                       ("pipeline_model_parallel_size", p.pipelineModelParallelSize),
                       ("num_layers", cfg.model.numLayers), ("hidden_size", cfg.model.hiddenSize)):
        theirs = getattr(args, name, ours)
        if theirs != ours:
            raise CheckpointMismatch(
                f"{where}: saved with {name}={theirs} but this run has {ours}; reshard it first with "
                f"`ascend-engine convert` (mcore -> mcore) or match the config")


def load_training_checkpoint(trainer) -> int | None:
    """Restore what ``cfg.checkpoint`` asks for; returns the iteration loaded (None when there is none yet).

    ``finetune`` loads weights only and starts at iteration 0; ``loadOptim``/``loadRng`` false skip those parts.
    A missing tracker file is not an error (the first run of a job that saves to the same folder).
    """
    from ..train.loop import unwrap

    cfg, info = trainer.cfg, trainer.info
    ck = cfg.checkpoint
    iteration = read_latest(ck.load)
    if iteration is None:
        if info.rank == 0:
            print(f"no checkpoint in {ck.load} (no latest_checkpointed_iteration.txt): training from scratch",
                  file=sys.stderr, flush=True)
        return None
    folder = checkpoint_dir(ck.load, iteration, info.tp_rank, info.pp_rank, info.pp)
    path = folder / MODEL_FILE
    if not path.is_file():
        raise CheckpointMismatch(f"{path}: missing; the checkpoint does not have this run's tensor/pipeline layout")
    state = torch.load(path, map_location="cpu", weights_only=False)
    if "args" in state:
        _check_layout(state["args"], cfg, path)
    unwrap(trainer.model).load_state_dict(state["model"], strict=True)

    resume = not ck.finetune and iteration != RELEASE
    if resume and ck.loadOptim and "optimizer" in state:
        trainer.optimizer.load_state_dict(state["optimizer"])
        if cfg.parallel.useDistributedOptimizer:
            trainer.optimizer.load_parameter_state(str(folder / DISTRIB_OPTIM_FILE))
        trainer.scheduler.load_state_dict(state["opt_param_scheduler"])
    else:
        trainer.optimizer.reload_model_params()  # copy the loaded weights into fp32 main params
    if resume and ck.loadRng and "rng_state" in state:
        rngs = state["rng_state"]
        set_rng_state(rngs[info.dp_rank] if len(rngs) == info.dp else rngs[0])
    if resume:
        trainer.iteration = int(state["iteration"])
        trainer.consumed = int(getattr(state.get("args"), "consumed_train_samples", trainer.iteration
                                       * cfg.training.globalBatchSize))
        trainer.last_checkpoint = trainer.iteration
    return trainer.iteration
