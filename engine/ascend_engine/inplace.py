"""In-place recovery: torchrun's elastic agent restarts a pod's workers without the pod being replaced.

With ``--max-restarts N`` and the c10d rendezvous, a worker that dies makes its pod's agent stop the other local
workers and open a new rendezvous round; the agents of the other pods see a node waiting and restart theirs, and
the new workers load the last checkpoint. No pod is deleted, scheduled or pulled again.

torchrun says nothing of this to the engine, so the launcher (the agent's own process) wraps two of the agent's
steps (``ascend_engine.agent_watch``; this module is the workers' side) and writes what it saw to a small JSON
record that the new workers read (``ASCEND_RECOVERY_RECORD``): how many restarts, and for the last one which local
ranks failed with which exit code, when the failure happened, when the agent noticed it and when the old workers
were stopped. It also keeps deliberate failures out of the loop: the engine exits 2 when it refuses its input (a bad
config, a missing dataset), which another try cannot fix, so the agent then gives up at once and the pod fails as
before.

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

The cause: a worker that fails writes its error line (``AssertionError: First dimension ...``) to the error file
torchrun gives it (``TORCHELASTIC_ERROR_FILE``, in torch's ErrorHandler format: ``record_worker_error``, called by
``telemetry.report_failure``); the agent reads it into its ``ProcessFailure`` and the launcher keeps it, with the exit
code, for every failure in the record, in its log line and in the termination report when it gives up.

One count for the job: torchrun's agents each count their own workers' failures (``--max-restarts`` per pod), so
with two pods a limit of 2 allowed 3 restarts, or 4. Here the count lives in the rendezvous store (the c10d
backend's, hosted by pod 0's agent and kept across rounds): the agents of one round share the count they started
it with, ``k``; the first agent whose workers fail in that round raises the job's count to ``k + 1`` (``store.add``
of a per-round claim, so a peer that fails because of it does not count it again), and every agent that sees a
failure in the round decides on ``k + 1``: restart while it is at most N, give up beyond. The first agent that
gives up leaves its report in the store; the agents that fail after it in the same round give up with the same
report, so every pod names the same cause. A gang restart starts a new store: the count is per attempt.

A failure that repeats the pod's previous failure's error line with no step trained in between (a worker says it
has trained one with ``trained_a_step``, a file beside the record) is not retried: another restart would fail the
same way (a layout Megatron refuses while building the model), so the agent gives up at once, ``RepeatedFailure``,
permanent.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from typing import Any

RECORD_ENV = "ASCEND_RECOVERY_RECORD"
TORCHRUN_RANK_ENV = "ASCEND_TORCHRUN_RANK"  # the rank torchrun gave, before rank_by_pod
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"  # torchrun's, one per worker and attempt
DELIBERATE_EXIT = 2  # the engine's own refusal (telemetry.fail): the same input fails the same way again
EXHAUSTED_REASON = "InPlaceRecoveryExhausted"
REPEATED_REASON = "RepeatedFailure"
TRAINED_FILE = "trained.json"  # beside the record: a worker of this pod has trained a step since the last failure
STORE_PREFIX = "ascend.inplace"  # the job's keys in the rendezvous store, next to torch.rendezvous.<run id>.*
MAX_LINE = 500  # characters of an error line kept (the termination message holds 4 KiB in all)
FAILURES_KEPT = 20  # the newest worker failures in the record


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


def error_line(reason: str, message: str) -> str:
    """The one line that says why a command failed: the message's first line, with the reason in front when the
    line does not already name it (``AssertionError: ...`` stays, ``bad training data: ...`` becomes
    ``DataError: bad training data: ...``)."""
    first = next((line.strip() for line in str(message).splitlines() if line.strip()), "")
    if not first:
        return reason[:MAX_LINE]
    from .exception_line import exception_line

    return (first if first.startswith(f"{reason}:") or exception_line(first) else f"{reason}: {first}")[:MAX_LINE]


def record_worker_error(line: str) -> None:
    """This worker's error line for its torchrun agent, in the error file torchrun named (the format torch's
    ``ErrorHandler.record_exception`` writes, which the agent reads into its ``ProcessFailure``); outside torchrun,
    nothing. Written whole (a rename), since the agent refuses a file it cannot parse."""
    path = os.environ.get(ERROR_FILE_ENV)
    if not path:
        return
    callstack = traceback.format_exc() if sys.exc_info()[0] is not None else line
    data = {"message": {"message": line, "extraInfo": {"py_callstack": callstack,
                                                       "timestamp": str(int(time.time()))}}}
    try:
        _write(path, data)
    except OSError:
        pass  # the agent then reports the exit code alone, as before


_TRAINED = False


def trained_a_step(iteration: int) -> None:
    """Tell this pod's agent that a step was trained (once per process: the first step is what counts), so that a
    later failure is not taken for the previous one repeating (``RepeatedFailure``)."""
    global _TRAINED
    path = os.environ.get(RECORD_ENV)
    if _TRAINED or not path:
        return
    _TRAINED = True
    try:
        _write(os.path.join(os.path.dirname(path), TRAINED_FILE),
               {"iteration": iteration, "rank": os.environ.get("RANK"), "at": time.time()})
    except OSError:
        pass


CHECKPOINTED_FILE = "checkpointed.json"  # beside the record: the job has promoted a checkpoint (warm spares start)


def checkpointed(iteration: int) -> None:
    """Tell this pod's agent that a checkpoint was promoted: its warm spares start then (``ascend_engine.spare``).
    Before a job's first checkpoint a restart at any level starts from scratch, and a job that never saves one
    (a short run, a test) pays no spare's imports or memory."""
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    marker = os.path.join(os.path.dirname(path), CHECKPOINTED_FILE)
    if not os.path.exists(marker):
        try:
            _write(marker, {"iteration": iteration, "at": time.time()})
        except OSError:
            pass
