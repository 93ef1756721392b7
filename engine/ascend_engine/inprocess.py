"""In-process restart: the healthy ranks restart the training function in their own processes, a warm spare takes
a dead rank's place, and the state comes back from host memory.

The rung below in-place recovery (``ascend_engine.inplace``, new worker processes). When one rank raises, or its
process dies, every other rank leaves its step (a collective with the failed rank fails), tears its process group
down, joins a new one and builds the trainer again in the same interpreter: torch, Megatron-core, the tokenizer and
the data index stay loaded; the model, optimizer and process groups are built again (they hold the old groups).
A rank whose process is gone is replaced by its pod's warm spare (``ascend_engine.spare``: a process that has
already imported torch and Megatron-core, started by the launcher), which its torchrun agent hands the dead
worker's environment. The last checkpoint's files are kept in host memory by the ranks that wrote them and
replicated to a peer rank in another pod (``checkpoint.memory``), so the restarted ranks load from memory and the
spare from its peer, not from the shared file system, which stays the source of truth for the rungs above.

Coordination goes through the rendezvous store that pod 0's torchrun agent hosts (``--rdzv-endpoint``), which
outlives every worker; the workers connect to it as clients. Keys, under ``ascend.inprocess.<run id>``:

* ``count``: the in-process restarts of this attempt (of every round of the in-place level), the generation;
* ``claim.<round>.<generation>``: the first rank (a raise) or agent (a death) to ``add`` 1 decides for the
  generation and writes ``decision.<round>.<generation>``: restart (to generation + 1, while the count is under
  ``runPolicy.recovery.inProcessRestarts`` and, for a death, a warm spare is ready) or not (the workers exit and
  the in-place level takes over: torchrun's agents restart every worker);
* ``pg.<round>.<generation>``: the process group's own keys, fresh for every generation.

A rank whose collective failed because a peer did (gloo's ``Connection closed by peer``) waits for the decision
rather than making one (``DECIDE_WAIT_S``), since the peer's raise or its agent's sight of the death says better
what happened; it decides itself only when nobody has.

Leaving the step: gloo cannot abort a collective (pytorch#130345) and keeps its connections open while anything
references the group, so a rank that raised would leave its peers blocked until the gloo timeout. Before
destroying the groups each rank shuts down the process group's own TCP connections (the sockets opened while the
groups formed, never a listening one), so every peer's pending collective fails at once. NCCL and HCCL have an
abort (``ProcessGroup.abort``), which is called instead.
"""
from __future__ import annotations

import gc
import json
import os
import socket
import stat
import sys
import time
from datetime import timedelta
from typing import Any

ENV_RESTARTS = "ASCEND_INPROCESS_RESTARTS"  # runPolicy.recovery.inProcessRestarts (0: off)
ENV_SPARES = "ASCEND_WARM_SPARES"  # runPolicy.recovery.warmSpares, per pod
ENV_MEMORY = "ASCEND_MEMORY_CHECKPOINT"  # runPolicy.recovery.stateFromMemory ("0": the shared file system)
ENV_ENDPOINT = "ASCEND_RDZV_ENDPOINT"  # host:port of the rendezvous store (set by the launcher)
ENV_JOIN = "ASCEND_INPROCESS_JOIN"  # a warm spare's generation to join (set by its agent)
PREFIX = "ascend.inprocess"
DECIDE_WAIT_S = 5.0  # a rank that saw a peer fail waits this long for the failed rank's (or its agent's) decision
JOIN_TIMEOUT_S = 120.0  # a new generation's process group forms within this, or the rank gives up (in place)


def limit() -> int:
    """In-process restarts allowed (0: the level is off)."""
    value = os.environ.get(ENV_RESTARTS, "")
    return int(value) if value.isdigit() else 0


def enabled() -> bool:
    return limit() > 0 and bool(os.environ.get(ENV_ENDPOINT)) and "TORCHELASTIC_RUN_ID" in os.environ


def connect(endpoint: str, timeout: float = 60.0):
    """A client of the rendezvous store that pod 0's agent hosts."""
    from torch.distributed import TCPStore

    host, port = endpoint.rsplit(":", 1)
    return TCPStore(host.strip("[]"), int(port), is_master=False, timeout=timedelta(seconds=timeout),
                    wait_for_workers=False)


class Coordinator:
    """The keys every rank and agent of the attempt agree through (see the module's docstring)."""

    def __init__(self, store, run_id: str, round_: int) -> None:
        self.store, self.round = store, round_
        self.prefix = f"{PREFIX}.{run_id}"

    def count(self) -> int:
        return int(self.store.add(f"{self.prefix}.count", 0))

    def _key(self, generation: int) -> str:
        return f"{self.prefix}.decision.{self.round}.{generation}"

    def claim(self, generation: int, failure: dict[str, Any], limit_: int, can_restart: bool = True
              ) -> dict[str, Any] | None:
        """Decide for ``generation`` if nobody has; either way return the decision."""
        if self.store.add(f"{self.prefix}.claim.{self.round}.{generation}", 1) != 1:
            return self.decision(generation, JOIN_TIMEOUT_S)
        restarts = self.count()
        restart = can_restart and restarts < limit_
        if restart:
            restarts = int(self.store.add(f"{self.prefix}.count", 1))
        decision = {**failure, "restart": restart, "generation": restarts if restart else generation,
                    "restarts": restarts, "limit": limit_, "detectedAt": time.time()}
        self.store.set(self._key(generation), json.dumps(decision))
        return decision

    def decision(self, generation: int, timeout: float) -> dict[str, Any] | None:
        key = self._key(generation)
        try:
            self.store.wait([key], timedelta(seconds=timeout))
        except Exception:  # noqa: BLE001 - a timeout: nobody has decided
            return None
        return json.loads(self.store.get(key))

    def pg_prefix(self, generation: int) -> str:
        return f"{self.prefix}.pg.{self.round}.{generation}"


def peer_failure(exc: BaseException) -> bool:
    """Whether a collective failed because a peer did (its process died, or it left the step): the failed rank or
    its agent decides, not this one."""
    import torch.distributed as dist

    text = str(exc)
    return isinstance(exc, getattr(dist, "DistError", ())) or any(s in text for s in (
        "Connection closed by peer", "Connection reset by peer", "Broken pipe", "gloo/transport", "NCCL error",
        "HCCL", "Socket Timeout", "Connection refused"))


def _socket_fds() -> set[int]:
    out = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                out.add(int(name))
        except (OSError, ValueError):
            pass
    return out


def shut_connections(fds: set[int]) -> int:
    """Shut down (not close: gloo owns the descriptors) the connected sockets among ``fds``; returns how many."""
    shut = 0
    for fd in fds:
        try:
            s = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            if not s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                s.shutdown(socket.SHUT_RDWR)
                shut += 1
        except OSError:
            pass
        finally:
            s.detach()
    return shut


def abort_process_groups(fds: set[int]) -> None:
    """Make every pending collective of this rank and its peers fail now, then destroy the groups."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        for pg in list(dist.distributed_c10d._world.pg_map):
            for device in ("cuda", "npu"):
                try:
                    backend = pg._get_backend(torch.device(device))
                except Exception:  # noqa: BLE001 - no backend for that device
                    continue
                if type(backend).__name__ in ("ProcessGroupNCCL", "ProcessGroupHCCL"):
                    backend.abort()
    shut_connections(fds)
    from .parallel import destroy_parallel

    try:
        destroy_parallel()
    except Exception:  # noqa: BLE001 - the groups are broken by design here; what is left goes with gc
        pass


def _say(line: str) -> None:
    print(f"[in-process] {line}", file=sys.stderr, flush=True)


class Session:
    """This worker's side of in-process restarts: the store, its generation, what outlives a restart."""

    def __init__(self) -> None:
        env = os.environ
        self.limit = limit()
        self.store = connect(env[ENV_ENDPOINT])
        self.coordinator = Coordinator(self.store, env["TORCHELASTIC_RUN_ID"],
                                       int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0))
        joined = env.get(ENV_JOIN)
        self.generation = int(joined) if joined else self.coordinator.count()
        self.memory_enabled = env.get(ENV_MEMORY, "1") != "0"
        from .checkpoint.memory import MemoryCheckpoint

        self.memory = MemoryCheckpoint()
        self.kept: dict[str, Any] = {}  # what a restart reuses: data, metrics server, trackers, rank 0's clock
        self.pg_fds: set[int] = set()
        self.restart: dict[str, Any] | None = None  # the decision this process is recovering from, and its marks
        if joined:  # a warm spare taking a dead rank's place: the decision it was started for
            decision = self.coordinator.decision(int(joined) - 1, JOIN_TIMEOUT_S) or {}
            self.restart = {**decision, "spare": True}

    def pg_store(self):
        from torch.distributed import PrefixStore

        return PrefixStore(self.coordinator.pg_prefix(self.generation), self.store)

    def keep(self, name: str, make):
        if name not in self.kept:
            self.kept[name] = make()
        return self.kept[name]

    def forming(self) -> set[int]:
        """Before the process group forms: the sockets that exist now are not the group's."""
        if self.restart is not None:
            self.restart["rejoinAt"] = time.time()
        return _socket_fds()

    def formed(self, before: set[int]) -> None:
        self.pg_fds = _socket_fds() - before

    def recover(self, exc: BaseException) -> bool:
        """After the training function raised: whether to run it again (the process group is torn down then)."""
        from .inplace import error_line
        from .node_rank import pod_index

        failed_at = time.time()
        line = error_line(type(exc).__name__, str(exc))
        failure = {"failedAt": failed_at, "rank": int(os.environ.get("RANK", "0")),
                   "podIndex": pod_index(), "localRank": os.environ.get("LOCAL_RANK"),
                   "error": line}
        decision = None
        if peer_failure(exc):
            decision = self.coordinator.decision(self.generation, DECIDE_WAIT_S)
        if decision is None:
            decision = self.coordinator.claim(self.generation, failure, self.limit)
        abort_process_groups(self.pg_fds)  # the peers' collectives fail now, whatever was decided
        self.pg_fds = set()
        if not decision or not decision.get("restart"):
            why = (f"in-process restarts used up ({self.limit})" if decision else "no decision in the store")
            _say(f"not restarting in process ({why}): {line}")
            return False
        gc.collect()  # the old trainer's cycles (the long-lived objects are frozen: see ``train.loop.train``)
        self.generation = int(decision["generation"])
        self.restart = {**decision, "stoppedAt": time.time()}
        _say(f"in-process restart {decision['restarts']}/{self.limit}: {describe(decision)}; rank "
             f"{os.environ.get('RANK')} restarts the training function in its process")
        return True


    def gather_marks(self) -> None:
        """Collective, once the new group has formed: when the ranks left their step and began joining again
        (the latest of each), and how many were warm spares."""
        import torch.distributed as dist

        r = self.restart
        assert r is not None
        mine = (r.get("stoppedAt"), r.get("rejoinAt"), bool(r.get("spare")))
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        stopped = [s for s, _, _ in everyone if s is not None]
        r["stoppedAt"] = max(stopped) if stopped else r.get("detectedAt")
        r["rejoinAt"] = max(j for _, j, _ in everyone if j is not None)
        r["spares"] = sum(1 for _, _, spare in everyone if spare)

    def summary(self, iteration: int) -> str:
        """The RecoveredInProcess event's words."""
        r = self.restart or {}
        spares = r.get("spares", 0)
        how = (f"{spares} warm spare(s) took the place of the dead rank(s), the other ranks restarted in their "
               "processes" if spares else "every rank restarted in its process")
        source = "host memory" if r.get("fromMemory") else "the shared checkpoint"
        return (f"in-process restart {r.get('restarts')}/{self.limit}: {describe(r)}; {how}; training resumes "
                f"from iteration {iteration} ({source})")

    def parts(self) -> dict[str, float]:
        """The last in-process restart's parts in seconds, as status.recoveries shows them (so far)."""
        r = self.restart or {}
        marks = [("detection", "failedAt", "detectedAt"), ("stopping", "detectedAt", "stoppedAt"),
                 ("podStart", "stoppedAt", "rejoinAt"), ("rendezvous", "rejoinAt", "joinedAt"),
                 ("checkpointLoad", "joinedAt", "firstStepAt"), ("retrain", "firstStepAt", "caughtUpAt")]
        return {part: round(max(0.0, r[end] - r[begin]), 2) for part, begin, end in marks
                if r.get(begin) is not None and r.get(end) is not None}

    def figures(self) -> dict[str, float]:
        """Rank 0's gauges of the last in-process restart (``telemetry.GOODPUT_METRICS``, level InProcess)."""
        r = self.restart or {}
        names = {"failedAt": "inProcessFailedTime", "detectedAt": "inProcessDetectedTime",
                 "stoppedAt": "inProcessStoppedTime", "rejoinAt": "inProcessRejoinedTime",
                 "joinedAt": "inProcessJoinedTime", "firstStepAt": "inProcessFirstStepTime",
                 "caughtUpAt": "inProcessCaughtUpTime", "loadedIteration": "inProcessLoadedIteration",
                 "highWater": "inProcessHighWaterIteration", "spares": "inProcessSpares"}
        out = {field: r[key] for key, field in names.items() if r.get(key) is not None}
        out["inProcessFromMemory"] = 1.0 if r.get("fromMemory") else 0.0
        out["inProcessRestarts"] = r.get("restarts", 0)
        return out


def describe(decision: dict[str, Any]) -> str:
    """``pod index 1 local rank 0 killed by SIGKILL``, ``rank 1: RuntimeError: ...``."""
    if decision.get("signal") or decision.get("exitCode") is not None:
        how = f"killed by {decision['signal']}" if decision.get("signal") else f"exit code {decision['exitCode']}"
        line = f" ({decision['error']})" if decision.get("error") else ""
        return f"pod index {decision.get('podIndex')} local rank {decision.get('localRank')} {how}{line}"
    return f"rank {decision.get('rank')} raised {decision.get('error')}"


_SESSION: Session | None = None


def session() -> Session | None:
    """This process's session, or None when the level is off (or outside torchrun with a rendezvous store)."""
    global _SESSION
    if _SESSION is None and enabled():
        _SESSION = Session()
    return _SESSION
