"""Save a training checkpoint in Megatron's layout, atomically across all ranks, optionally in the background.

A save has two halves. ``begin_checkpoint`` (collective, on the training thread) takes the files as bytes
already serialised in memory, so the model may change as soon as it returns, and starts writing them into
``iter_XXXXXXX.tmp/``, inline or on a writer thread. ``CheckpointWrite.finish`` (collective) waits for every
rank's writes, has rank 0 write ``manifest.json`` (size and SHA-256 of every file), rename the folder into place
and only then move ``latest_checkpointed_iteration.txt``, and prunes checkpoints beyond ``keep_last``. A crash at
any point leaves the previous checkpoint and tracker untouched (at worst a stale ``.tmp`` folder, which the next
save removes). The writer thread does file I/O only, never a collective, so it cannot interleave with training's.
"""
from __future__ import annotations

import hashlib
import io
import os
import shutil
import threading
from pathlib import Path

import torch

from ..device import all_reduce_host
from .layout import iteration_dir, read_latest, write_latest
from .manifest import write_manifest

CHECKPOINT_VERSION = 3.0


def _barrier() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def _gather(obj) -> list:
    if not torch.distributed.is_initialized():
        return [obj]
    out = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def serialize(obj) -> memoryview:
    """``torch.save`` into memory: a snapshot of the tensors' values at this moment (a view of the buffer, not a
    second copy of it)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getbuffer()


def write_file(data: bytes | memoryview, path: Path) -> None:
    """Write, flush to the device, then rename into place: a reader never sees half a file under its name."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class CheckpointWrite:
    """One rank's part of a checkpoint on its way to disk."""

    def __init__(self, root: Path, iteration: int, rank_dir: Path, files: dict[str, memoryview], is_rank0: bool,
                 keep_last: int | None):
        self.root, self.iteration, self.rank_dir, self.is_rank0 = root, iteration, rank_dir, is_rank0
        self.final = iteration_dir(root, iteration)
        self.staging = self.final.with_name(self.final.name + ".tmp")
        self.keep_last = keep_last
        self._files = files
        self._entries: dict[str, dict] = {}
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def _write(self) -> None:
        try:
            for name, data in self._files.items():
                path = self.rank_dir / name
                write_file(data, path)
                self._entries[str(path.relative_to(self.staging))] = {
                    "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        except BaseException as e:  # re-raised by finish(), on the training thread
            self._error = e
        finally:
            self._files = {}  # the bytes are on disk (or lost): let them go

    def start(self, background: bool) -> "CheckpointWrite":
        if background:
            self._thread = threading.Thread(target=self._write, name=f"checkpoint-writer-{self.iteration}",
                                            daemon=True)
            self._thread.start()
        else:
            self._write()
        return self

    def written(self) -> bool:
        """Whether this rank's files are written (local; see ``finish`` for all ranks)."""
        return self._thread is None or not self._thread.is_alive()

    def written_everywhere(self) -> bool:
        """Collective: whether every rank's files are written, so that ``finish`` will not wait."""
        done = torch.tensor([1.0 if self.written() else 0.0], dtype=torch.float64)
        done = all_reduce_host(done, torch.distributed.ReduceOp.MIN)
        return done.item() > 0

    def finish(self) -> Path:
        """Collective: wait for every rank's files, then verify-and-promote on rank 0. Returns the final folder."""
        if self._thread is not None:
            self._thread.join()
        error = f"{type(self._error).__name__}: {self._error}" if self._error else None
        results = _gather((error, self._entries))
        failed = [(rank, e) for rank, (e, _) in enumerate(results) if e]
        if failed:
            if self._error is not None:
                raise self._error
            rank, message = failed[0]
            raise RuntimeError(f"checkpoint {self.final}: rank {rank} could not write its files: {message}")
        if self.is_rank0:
            entries = {path: entry for _, rank_entries in results for path, entry in rank_entries.items()}
            write_manifest(self.staging, self.iteration, entries)
            old = self.final.with_name(self.final.name + ".old")
            if self.final.exists():  # re-saving the same iteration: keep the old copy until the new one is in place
                shutil.rmtree(old, ignore_errors=True)
                os.replace(self.final, old)
            os.replace(self.staging, self.final)
            write_latest(self.root, self.iteration)
            shutil.rmtree(old, ignore_errors=True)
            if self.keep_last:
                prune(self.root, self.keep_last)
        _barrier()
        return self.final


def begin_checkpoint(root: str | os.PathLike, iteration: int, rank_dir_name: str, files: dict[str, memoryview],
                     is_rank0: bool, background: bool = False, keep_last: int | None = None) -> CheckpointWrite:
    """Collective: every rank calls it with the files it writes into ``rank_dir_name`` (none on most ranks)."""
    root = Path(root)
    final = iteration_dir(root, iteration)
    staging = final.with_name(final.name + ".tmp")
    if is_rank0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
    _barrier()
    rank_dir = staging / rank_dir_name
    rank_dir.mkdir(exist_ok=True)
    return CheckpointWrite(root, iteration, rank_dir, files, is_rank0, keep_last).start(background)


def prune(root: Path, keep_last: int) -> list[Path]:
    """Remove all but the ``keep_last`` newest checkpoints up to the latest one; checkpoints newer than the
    tracker (left by a run that fell back from them) are not this run's to judge and stay."""
    latest = read_latest(root)
    if not isinstance(latest, int):
        return []
    iterations = sorted(i for i in saved_iterations(root) if i <= latest)
    removed = []
    for iteration in iterations[:-keep_last]:
        path = iteration_dir(root, iteration)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def saved_iterations(root: Path) -> list[int]:
    """The iterations with a complete folder (``iter_0000100``; not staging or half-replaced ones)."""
    out = []
    for path in Path(root).glob("iter_*"):
        suffix = path.name[len("iter_"):]
        if path.is_dir() and suffix.isdigit():
            out.append(int(suffix))
    return sorted(out)
