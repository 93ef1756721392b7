"""Process groups from torchrun's environment: torch.distributed plus Megatron's model-parallel groups."""
from __future__ import annotations

import os
import random
from dataclasses import dataclass
from datetime import timedelta

import torch

from .device import Backend
from .inplace import worker_store


@dataclass(frozen=True)
class ParallelInfo:
    rank: int
    world_size: int
    tp_rank: int
    pp_rank: int
    dp_rank: int
    tp: int
    pp: int
    dp: int
    ep_rank: int = 0
    ep: int = 1

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def init_parallel(backend: Backend, tp: int, pp: int, seed: int, ep: int = 1, vpp: int | None = None,
                  store=None) -> ParallelInfo:
    """Join the torchrun world (a world of one when started without torchrun) and build Megatron's groups.

    Seeds python/torch with ``seed`` on every rank (so full-model initialisation is rank independent) and
    Megatron's model-parallel RNG tracker the way Megatron-LM does. ``ep`` splits routed experts over
    expert-parallel ranks; expert layers keep the dense layers' TP (Megatron's default expert TP size). ``vpp``
    model chunks per pipeline rank select Megatron's interleaved schedule. ``store``: the process group's
    key-value store (an in-process restart's generation, ``ascend_engine.inprocess``), else torchrun's.
    """
    backend.apply()  # before Megatron is imported, so its CUDA calls are redirected from the start
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    rank, world_size = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    if not torch.distributed.is_initialized():
        timeout = timedelta(minutes=_env_int("ASCEND_DIST_TIMEOUT_MIN", 30))
        # Started without torchrun: a world of one needs no TCP rendezvous (and no port that may be taken).
        if store is None:
            store = torch.distributed.HashStore() if "MASTER_ADDR" not in os.environ and world_size == 1 else \
                worker_store(world_size, timeout)  # under in-place restarts (ascend_engine.inplace)
        torch.distributed.init_process_group(backend=backend.dist_backend, rank=rank, world_size=world_size,
                                             timeout=timeout, store=store)
    if world_size % (tp * pp):
        raise ValueError(f"world size {world_size} is not divisible by tp x pp = {tp} x {pp}")
    if world_size % (tp * pp * ep):
        raise ValueError(f"world size {world_size} is not divisible by tp x pp x ep = {tp} x {pp} x {ep}")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                             expert_model_parallel_size=ep, virtual_pipeline_model_parallel_size=vpp)
    random.seed(seed)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)
    return ParallelInfo(
        rank=rank, world_size=world_size,
        tp_rank=parallel_state.get_tensor_model_parallel_rank(),
        pp_rank=parallel_state.get_pipeline_model_parallel_rank(),
        dp_rank=parallel_state.get_data_parallel_rank(),
        tp=tp, pp=pp, dp=parallel_state.get_data_parallel_world_size(),
        ep_rank=parallel_state.get_expert_model_parallel_rank(), ep=ep,
    )


def destroy_parallel() -> None:
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    # destroy_model_parallel leaves a few groups set (the partial data-parallel ones, megatron-core 0.12-0.16): held,
    # each keeps gloo's loop threads and sockets alive, two more groups at every in-process restart
    for name, value in list(vars(parallel_state).items()):
        if not (name.isupper() and "GROUP" in name):
            continue
        if isinstance(value, torch.distributed.ProcessGroup):
            setattr(parallel_state, name, None)
        elif isinstance(value, dict) and any(isinstance(v, torch.distributed.ProcessGroup) for v in value.values()):
            value.clear()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
