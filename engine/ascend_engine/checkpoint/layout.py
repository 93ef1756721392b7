"""Megatron's checkpoint paths: ``<root>/latest_checkpointed_iteration.txt`` and
``<root>/iter_0000100/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt``: the pipeline suffix only when PP > 1, the
expert-parallel suffix only when EP > 1 (Megatron-LM's ``get_checkpoint_name``; so ``mp_rank_00_001`` is PP rank 1
or EP rank 1, and readers tell which from the checkpoint's args).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

TRACKER_FILE = "latest_checkpointed_iteration.txt"
MODEL_FILE = "model_optim_rng.pt"
DISTRIB_OPTIM_FILE = "distrib_optim.pt"  # the distributed optimizer's shards beside it, one file a rank
RELEASE = "release"


def iteration_dir(root: str | os.PathLike, iteration: int | str) -> Path:
    """``iter_0000100`` (or ``release`` for converted checkpoints, as Megatron spells it)."""
    name = RELEASE if iteration == RELEASE else f"iter_{int(iteration):07d}"
    return Path(root) / name


def rank_dir_name(tp_rank: int, pp_rank: int, pp: int, ep_rank: int = 0, ep: int = 1) -> str:
    name = f"mp_rank_{tp_rank:02d}" if pp == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"
    return name if ep == 1 else f"{name}_{ep_rank:03d}"


def checkpoint_dir(root: str | os.PathLike, iteration: int | str, tp_rank: int, pp_rank: int, pp: int,
                   ep_rank: int = 0, ep: int = 1) -> Path:
    """The folder holding one model-parallel rank's ``model_optim_rng.pt``."""
    return iteration_dir(root, iteration) / rank_dir_name(tp_rank, pp_rank, pp, ep_rank, ep)


def checkpoint_file(root: str | os.PathLike, iteration: int | str, tp_rank: int, pp_rank: int, pp: int,
                    ep_rank: int = 0, ep: int = 1) -> Path:
    return checkpoint_dir(root, iteration, tp_rank, pp_rank, pp, ep_rank, ep) / MODEL_FILE


def read_latest(root: str | os.PathLike) -> int | str | None:
    """The iteration in the tracker file (an int, or ``"release"``); None when there is no checkpoint."""
    tracker = Path(root) / TRACKER_FILE
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    if text == RELEASE:
        return RELEASE
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{tracker}: expected an iteration number or 'release', got {text!r}") from None


def write_latest(root: str | os.PathLike, iteration: int | str) -> None:
    """Point the tracker at ``iteration`` atomically (temp file in the same folder, then rename)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{TRACKER_FILE}.", dir=root)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"{iteration}\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; readers (converters, other users) need to read it
        os.replace(tmp, root / TRACKER_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
