"""Save a training checkpoint in Megatron's layout, atomically across all ranks.

Every writer puts its file into ``iter_XXXXXXX.tmp/``; after a barrier rank 0 renames the folder into place and
only then moves ``latest_checkpointed_iteration.txt``. A crash at any point leaves the previous checkpoint and
tracker untouched (at worst a stale ``.tmp`` folder, which the next save removes).
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from .layout import MODEL_FILE, iteration_dir, rank_dir_name, write_latest

CHECKPOINT_VERSION = 3.0


def _barrier() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def atomic_torch_save(obj, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(root: str | os.PathLike, iteration: int, state: dict | None, tp_rank: int, pp_rank: int,
                    pp: int, is_rank0: bool, write_collective: Callable[[Path], None] | None = None,
                    ep_rank: int = 0, ep: int = 1) -> Path:
    """Collective: every rank calls it; ranks with a ``state`` (one per model-parallel rank) write it.

    ``state`` is the file dict (model, args, optimizer, ...); ``checkpoint_version`` and ``iteration`` are added.
    ``write_collective(rank_dir)`` runs on every rank into the staging folder (the distributed optimizer
    gathers its shards there). Returns the final iteration folder.
    """
    root = Path(root)
    final = iteration_dir(root, iteration)
    staging = final.with_name(final.name + ".tmp")
    if is_rank0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
    _barrier()
    rank_dir = staging / rank_dir_name(tp_rank, pp_rank, pp, ep_rank, ep)
    rank_dir.mkdir(exist_ok=True)
    if write_collective is not None:
        write_collective(rank_dir)
    if state is not None:
        atomic_torch_save({**state, "checkpoint_version": CHECKPOINT_VERSION, "iteration": iteration},
                          rank_dir / MODEL_FILE)
    _barrier()
    if is_rank0:
        old = final.with_name(final.name + ".old")
        if final.exists():  # re-saving the same iteration: keep the old copy until the new one is in place
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        os.replace(staging, final)
        write_latest(root, iteration)
        shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final
