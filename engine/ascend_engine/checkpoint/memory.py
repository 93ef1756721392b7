"""The last checkpoint in host memory, replicated to a peer: what an in-process restart loads from.

Every checkpoint is serialised in memory before it is written (``save.serialize``); the ranks that write files
keep those bytes (``keep``) instead of dropping them once on disk. When the checkpoint is promoted (its manifest
written and ``latest`` moved: ``Trainer.finish_save``, a collective), each rank sends what it keeps to its peer,
the same local rank in the next pod (the next rank when there is one pod), which keeps it as a replica
(``commit``). So the memory holds exactly the newest checkpoint of the shared file system, twice, in two pods.

After an in-process restart every rank of the new process group says what it holds (``restore``, a collective);
when each rank's files are held by someone at one iteration, the ranks that lack theirs (a warm spare, which
holds nothing) receive them from a holder and every rank loads them as ``checkpoint.training`` loads files.
Otherwise the ranks load from the shared file system, as before. The shared checkpoint stays the source of truth:
the memory is only ever a copy of its newest iteration, and a gang restart or a resize reads the files.

What it costs: the host memory of one checkpoint shard per writing rank and one replica (the model, the
optimizer's state and the distributed optimizer's shards of one model-parallel rank), and at each promotion one
send of that shard to the peer over the training's process group when it is gloo (CPU), else over a gloo group of
the world made for it (NCCL and HCCL move device tensors only).
"""
from __future__ import annotations

import io
import pickle
from typing import Any

import torch


def _send_recv(sends: dict[int, bytes], recvs: set[int], group=None) -> dict[int, bytes]:
    """Point-to-point: ``sends`` {peer: bytes} out, a payload in from each rank in ``recvs`` (collective over
    the ranks named). Sizes first, then the bytes, all posted before any wait (gloo's sends block otherwise)."""
    import torch.distributed as dist

    sizes_out = {p: torch.tensor([len(b)], dtype=torch.int64) for p, b in sends.items()}
    sizes_in = {p: torch.zeros(1, dtype=torch.int64) for p in recvs}
    work = [dist.isend(t, p, group=group) for p, t in sizes_out.items()] + \
        [dist.irecv(t, p, group=group) for p, t in sizes_in.items()]
    for w in work:
        w.wait()
    data_out = {p: torch.frombuffer(bytearray(b), dtype=torch.uint8) for p, b in sends.items() if len(b)}
    data_in = {p: torch.empty(int(t.item()), dtype=torch.uint8) for p, t in sizes_in.items() if int(t.item())}
    work = [dist.isend(t, p, group=group) for p, t in data_out.items()] + \
        [dist.irecv(t, p, group=group) for p, t in data_in.items()]
    for w in work:
        w.wait()
    return {p: t.numpy().tobytes() for p, t in data_in.items()}


def peer_of(rank: int, world: int, local_world: int) -> int:
    """Where a rank's files are replicated: the same local rank in the next pod, or the next rank in one pod."""
    return (rank + local_world) % world if world > local_world else (rank + 1) % world


class MemoryCheckpoint:
    """This rank's files of the newest promoted checkpoint and the replica of its source's: {rank dir: {file:
    bytes}} at ``iteration``."""

    def __init__(self) -> None:
        self.iteration: int | None = None
        self.held: dict[str, dict[str, bytes]] = {}
        self._pending: tuple[int, str, dict[str, Any]] | None = None
        self.group = None  # the host-side group the bytes travel over (None: the world's, when it is gloo)
        self.commit_seconds: list[float] = []  # what keeping and replicating each promoted checkpoint took

    def join(self) -> None:
        """Collective, once the process group has formed: NCCL and HCCL move device tensors only, so with them the
        bytes travel over a gloo group of the world, made here."""
        import torch.distributed as dist

        self.group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None

    @property
    def nbytes(self) -> int:
        return sum(len(b) for files in self.held.values() for b in files.values())

    def keep(self, iteration: int, rank_dir: str, files: dict[str, Any]) -> None:
        """The files a save is writing (serialised bytes: kept as they are, no copy)."""
        self._pending = (iteration, rank_dir, dict(files))

    def commit(self, iteration: int, rank: int, world: int, local_world: int) -> None:
        """Collective, when checkpoint ``iteration`` is promoted: keep this rank's files and replicate them."""
        import time

        import torch.distributed as dist

        began = time.perf_counter()
        own: dict[str, dict[str, bytes]] = {}
        if self._pending is not None and self._pending[0] == iteration:
            own = {self._pending[1]: {name: bytes(data) if not isinstance(data, bytes) else data
                                      for name, data in self._pending[2].items()}}
        self._pending = None
        replica: dict[str, dict[str, bytes]] = {}
        if world > 1 and dist.is_initialized():
            peer, source = peer_of(rank, world, local_world), None
            source = next(r for r in range(world) if peer_of(r, world, local_world) == rank)
            received = _send_recv({peer: pickle.dumps(own) if own else b""}, {source}, self.group)
            replica = pickle.loads(received[source]) if received.get(source) else {}
        self.held = {**replica, **own}
        self.iteration = iteration
        self.commit_seconds.append(time.perf_counter() - began)

    def restore(self, trainer, rank_dir: str) -> tuple[int, dict[str, bytes]] | None:
        """Collective over the new process group: (iteration, this rank's files) when every rank's files are held
        by some rank at one iteration (sent to the ranks that lack theirs), else None on every rank."""
        import torch.distributed as dist

        world, rank = dist.get_world_size(), dist.get_rank()
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, (self.iteration, sorted(self.held), rank_dir), group=self.group)
        iterations = {it for it, dirs, _ in everyone if it is not None and dirs}
        if len(iterations) != 1:
            return None
        iteration = iterations.pop()
        holders: dict[str, list[int]] = {}
        for r, (it, dirs, _) in enumerate(everyone):
            if it == iteration:
                for d in dirs:
                    holders.setdefault(d, []).append(r)
        if any(d not in holders for _, _, d in everyone):
            return None
        sends: dict[int, bytes] = {}
        recvs: set[int] = set()
        for r, (_, _, d) in enumerate(everyone):
            if r in holders[d]:
                continue
            src = holders[d][0]
            if src == rank:
                sends[r] = pickle.dumps(self.held[d])
            if r == rank:
                recvs.add(src)
        received = _send_recv(sends, recvs, self.group) if sends or recvs else {}
        files = self.held.get(rank_dir) or (pickle.loads(next(iter(received.values()))) if received else None)
        if files is None:
            raise RuntimeError(f"memory checkpoint: no files for {rank_dir}")
        if rank_dir not in self.held:
            self.held[rank_dir] = files  # a spare keeps what it was sent: the next restart finds it here
            self.iteration = iteration
        return iteration, files


def load_state(files: dict[str, bytes]) -> tuple[dict, bytes | None]:
    """The model file's state and the distributed optimizer's shards, as ``checkpoint.training`` reads files."""
    from .layout import DISTRIB_OPTIM_FILE, MODEL_FILE

    state = torch.load(io.BytesIO(files[MODEL_FILE]), map_location="cpu", weights_only=False)
    return state, files.get(DISTRIB_OPTIM_FILE)
