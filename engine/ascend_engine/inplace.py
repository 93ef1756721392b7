"""In-place recovery: torchrun's elastic agent restarts a pod's workers without the pod being replaced.

With ``--max-restarts N`` and the c10d rendezvous, a worker that dies makes its pod's agent stop the other local
workers and open a new rendezvous round; the agents of the other pods see a node waiting and restart theirs, and
the new workers load the last checkpoint. No pod is deleted, scheduled or pulled again.

torchrun says nothing of this to the engine, so the launcher (the agent's own process) wraps two of the agent's
steps and writes what it saw to a small JSON record that the new workers read (``ASCEND_RECOVERY_RECORD``):
how many restarts, and for the last one which local ranks failed with which exit code, when the failure happened,
when the agent noticed it and when the old workers were stopped. It also keeps deliberate failures out of the
loop: the engine exits 2 when it refuses its input (a bad config, a missing dataset), which another try cannot
fix, so the agent then gives up at once and the pod fails as before.

Rank assignment: the c10d rendezvous numbers nodes in the order of their addresses, not by pod index, but rank 0
must live in pod 0 (its metrics are the job's progress). ``rank_by_pod`` renumbers each worker from the pod's
``NODE_RANK`` before the process group forms, and ``worker_store`` gives the process group its key-value store:
hosted by the worker torchrun numbered 0, at the address torchrun gave (the first agent's, with a port free for
this round). torchrun's default, one store kept by the first agent for every round, still holds the previous
round's keys after a restart (the dead workers' addresses, which a new worker then dials and times out on), so
the launcher turns that sharing off for in-place restarts.

Stopping: for a restart the old workers are killed (SIGKILL), not asked to stop: their state is thrown away and
the new ones load the checkpoint, and a worker asked with SIGTERM would try to finish its step and save
(``train/preemption.py``) while its peer is gone, holding the restart up for torchrun's 30 s.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import tempfile
import time
from typing import Any

RECORD_ENV = "ASCEND_RECOVERY_RECORD"
TORCHRUN_RANK_ENV = "ASCEND_TORCHRUN_RANK"  # the rank torchrun gave, before rank_by_pod
DELIBERATE_EXIT = 2  # the engine's own refusal (telemetry.fail): the same input fails the same way again
EXHAUSTED_REASON = "InPlaceRecoveryExhausted"


def rank_by_pod() -> None:
    """Under torchrun with the operator's contract (``NODE_RANK`` = pod index), make the global rank the pod's:
    ``NODE_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK`` (what the static rendezvous gives; a no-op there)."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" not in env or not env.get("NODE_RANK") or "LOCAL_RANK" not in env:
        return
    env[TORCHRUN_RANK_ENV] = env["RANK"]
    env["GROUP_RANK"] = env["NODE_RANK"]
    env["RANK"] = str(int(env["NODE_RANK"]) * int(env["LOCAL_WORLD_SIZE"]) + int(env["LOCAL_RANK"]))


def worker_store(world_size: int, timeout):
    """The process group's store under a c10d rendezvous without a shared agent store (None otherwise: torch's
    ``env://`` then does what torchrun set up). Hosted by torchrun's rank 0, whatever rank it is now."""
    env = os.environ
    if TORCHRUN_RANK_ENV not in env or env.get("TORCHELASTIC_USE_AGENT_STORE") != "False":
        return None
    from torch.distributed import TCPStore

    return TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), world_size, is_master=env[TORCHRUN_RANK_ENV] == "0",
                    timeout=timeout)


def read_record() -> dict[str, Any] | None:
    """This pod's agent's record (None outside torchrun, or before any restart)."""
    path = os.environ.get(RECORD_ENV)
    try:
        with open(path or "", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write(path: str, record: dict[str, Any]) -> None:
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".record-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def watch_agent(max_restarts: int) -> dict[str, Any]:
    """Wrap the elastic agent's monitor and restart steps (in the launcher's process, before torchrun starts);
    returns the live record (also written to ``ASCEND_RECOVERY_RECORD`` for the workers)."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent, WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    folder = tempfile.mkdtemp(prefix="ascend-recovery-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # the workers are gone by the launcher's exit
    path = os.path.join(folder, "record.json")
    os.environ[RECORD_ENV] = path
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # a fresh store per round: see worker_store
    record: dict[str, Any] = {"restarts": 0, "maxRestarts": max_restarts, "last": None, "exhausted": False,
                              "podIndex": os.environ.get("NODE_RANK")}
    _write(path, record)
    monitor, restart = LocalElasticAgent._monitor_workers, SimpleElasticAgent._restart_workers

    def monitored(agent, worker_group):
        result = monitor(agent, worker_group)
        if result.state in {WorkerState.UNHEALTHY, WorkerState.FAILED}:
            failures = [{"localRank": f.local_rank, "exitCode": f.exitcode, "failedAt": float(f.timestamp),
                         "signal": f.signal_name() if f.exitcode < 0 else None}
                        for f in result.failures.values()]
            record["pending"] = {"failures": failures, "detectedAt": time.time()}
            if failures and all(f["exitCode"] == DELIBERATE_EXIT for f in failures):
                agent._remaining_restarts = 0  # the engine refused its input: no restart can fix it
            elif agent._remaining_restarts == 0:
                record.update(exhausted=True, last=record.pop("pending"))
        return result

    def restarted(agent, worker_group):
        # no failure seen here: healthy workers, restarted because another pod's agent opened a new round
        last = record.pop("pending", None) or {"failures": [], "detectedAt": time.time()}
        record.update(restarts=record["restarts"] + 1, last=last)
        def stop_then_write(group):
            agent._shutdown(death_sig=signal.SIGKILL)
            last["stoppedAt"] = time.time()
            _write(path, record)  # before the rendezvous: the new workers read it as they start

        agent._stop_workers = stop_then_write
        try:
            restart(agent, worker_group)
        finally:
            del agent._stop_workers

    LocalElasticAgent._monitor_workers = monitored
    SimpleElasticAgent._restart_workers = restarted
    return record


def exhausted_report(record: dict[str, Any]) -> dict[str, Any] | None:
    """The launcher's termination report when in-place restarts ran out on failures another try might fix (the
    operator then replaces the gang), or None (no restarts configured, or a deliberate failure: the engine's own
    report stands)."""
    if not record.get("exhausted"):
        return None
    failed = ", ".join(f"local rank {f['localRank']} " + (f"killed by {f['signal']}" if f.get("signal") else
                                                          f"exit code {f['exitCode']}")
                       for f in (record.get("last") or {}).get("failures", [])) or "a worker failed"
    return {"status": "Failed", "reason": EXHAUSTED_REASON,
            "message": f"{failed} after {record['restarts']} in-place restart(s) "
                       f"(runPolicy.recovery.inPlaceRestarts {record['maxRestarts']})"}
