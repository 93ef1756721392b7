"""The torchrun agent's side of worker recovery (``ascend_engine.inplace`` says how in-place restarts work, and
``ascend_engine.inprocess`` the in-process level): in the launcher's process, before torchrun starts, the elastic
agent's monitor and restart steps are wrapped so that a failed worker is met at the cheapest level the job allows
(a warm spare swapped in for an in-process restart, else an in-place restart counted once for the job in the
rendezvous store), every failure is kept in the record with its error line, and the launcher's termination report
names the cause when the level is used up (``exhausted_report``).

Kept apart from ``inplace`` (which the workers import: their store, their error line, their marks) because it
reaches up to the in-process level and the warm spares, which import the training itself.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

from .inplace import (CHECKPOINTED_FILE, DELIBERATE_EXIT, EXHAUSTED_REASON, FAILURES_KEPT, MAX_LINE, RECORD_ENV,
                      REPEATED_REASON, STORE_PREFIX, TRAINED_FILE, _write)
from .node_rank import pod_index


def _failure(f) -> dict[str, Any]:
    """One worker failure as the record keeps it, from torchrun's ``ProcessFailure``: the error line is the one
    the worker wrote to its error file (None when it wrote none: killed by a signal, or it died before it could)."""
    message = f.message if f.error_file != "<N/A>" else None
    if isinstance(message, dict):
        message = message.get("message")
    line = next((x.strip() for x in message.splitlines() if x.strip()), None) if isinstance(message, str) else None
    return {"localRank": f.local_rank, "exitCode": f.exitcode, "failedAt": float(f.timestamp),
            "signal": f.signal_name() if f.exitcode < 0 else None, "error": line[:MAX_LINE] if line else None}


def _cause(failures: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The failure that explains the others: the first one with an error line, else the first one."""
    ordered = sorted(failures, key=lambda f: (f["failedAt"], f["localRank"]))
    return next((f for f in ordered if f.get("error")), ordered[0] if ordered else None)


def describe(f: dict[str, Any]) -> str:
    """``AssertionError: ... (local rank 0, exit code 1)``, ``local rank 0 killed by SIGKILL``, ``local rank 0 exit
    code 1``."""
    if f.get("error"):
        how = f"killed by {f['signal']}" if f.get("signal") else f"exit code {f['exitCode']}"
        return f"{f['error']} (local rank {f['localRank']}, {how})"
    return f"local rank {f['localRank']} " + (f"killed by {f['signal']}" if f.get("signal") else
                                              f"exit code {f['exitCode']}")


class JobCount:
    """The job's in-place restart count in the rendezvous store (see the module's docstring)."""

    def __init__(self, worker_group) -> None:
        store = worker_group.store  # this round's prefix over the rendezvous backend's store, kept across rounds
        self.store = getattr(store, "underlying_store", store)
        self.prefix = f"{STORE_PREFIX}.{worker_group.spec.rdzv_handler.get_run_id()}"

    def failed(self, k: int) -> int:
        """A failure in the round begun at count ``k``: counted once however many agents see one."""
        if self.store.add(f"{self.prefix}.failed.{k}", 1) == 1:
            self.store.add(f"{self.prefix}.restarts", 1)
        return k + 1

    def current(self) -> int:
        return int(self.store.add(f"{self.prefix}.restarts", 0))

    def given_up(self, k: int) -> dict[str, Any] | None:
        key = f"{self.prefix}.gave-up.{k}"
        return json.loads(self.store.get(key)) if self.store.check([key]) else None

    def give_up(self, k: int, report: dict[str, Any]) -> None:
        self.store.set(f"{self.prefix}.gave-up.{k}", json.dumps(report))


def _say(line: str) -> None:
    print(f"[torchrun] {line}", file=sys.stderr, flush=True)


def watch_agent(max_restarts: int) -> dict[str, Any]:
    """Wrap the elastic agent's monitor and restart steps (in the launcher's process, before torchrun starts);
    returns the live record (also written to ``ASCEND_RECOVERY_RECORD`` for the workers)."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent, WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    folder = tempfile.mkdtemp(prefix="ascend-recovery-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # the workers are gone by the launcher's exit
    path = os.path.join(folder, "record.json")
    trained_path = os.path.join(folder, TRAINED_FILE)
    checkpointed_path = os.path.join(folder, CHECKPOINTED_FILE)
    os.environ[RECORD_ENV] = path
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # a fresh store per round: see worker_store
    record: dict[str, Any] = {"restarts": 0, "maxRestarts": max_restarts, "last": None, "exhausted": False,
                              "permanent": False, "podIndex": pod_index(), "failures": []}
    _write(path, record)
    monitor, restart = LocalElasticAgent._monitor_workers, SimpleElasticAgent._restart_workers
    from .inprocess import ENV_ENDPOINT, ENV_JOIN, ENV_SPARES, Coordinator, limit as in_process_limit

    in_process = in_process_limit() if os.environ.get(ENV_ENDPOINT) else 0
    spare_count = os.environ.get(ENV_SPARES, "1")
    spares = None
    if in_process and spare_count.isdigit() and int(spare_count) > 0:
        from .spare import WarmSpares

        spares = WarmSpares(int(spare_count), folder)
    alive = {"at": time.time()}  # when every worker was last seen running: a death's time is after it

    def replace_dead(agent, worker_group) -> None:
        """In-process restarts: a worker that died is replaced by a warm spare before torchrun's monitor sees it
        (which would stop every worker of the pod), when the job's count allows and a spare is ready; the
        restarted ranks of every pod meet it in the next generation's process group (``ascend_engine.inprocess``).
        Otherwise torchrun's monitor sees the death: the in-place level."""
        from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

        pc = agent._pcontext
        for lr, handler in (getattr(pc, "subprocess_handlers", None) or {}).items():
            code = handler.proc.poll()
            if code in (None, 0, DELIBERATE_EXIT):
                continue
            f = _failure(ProcessFailure(local_rank=lr, pid=handler.proc.pid, exitcode=code,
                                        error_file=pc.error_files[lr]))
            pod = pod_index() or 0
            failure = {"failedAt": alive["at"], "rank": pod * worker_group.spec.local_world_size + lr,
                       "podIndex": pod, "localRank": lr, "exitCode": f["exitCode"], "signal": f["signal"],
                       "error": f["error"]}
            ready = spares.ready() if spares else None
            try:
                coordinator = Coordinator(JobCount(worker_group).store, worker_group.spec.rdzv_handler.get_run_id(),
                                          record["restarts"])
                decision = coordinator.claim(coordinator.count(), failure, in_process, can_restart=ready is not None)
            except Exception as e:  # noqa: BLE001 - the store unreachable: torchrun's own path decides
                _say(f"no in-process restart: the rendezvous store is unreachable ({type(e).__name__}: {e})")
                return
            if not decision or not decision.get("restart") or ready is None:
                why = "no warm spare ready" if ready is None else f"in-process restarts used up ({in_process})"
                _say(f"no in-process restart for local rank {lr} ({why}): {describe(f)}")
                return
            try:
                os.unlink(pc.error_files[lr])  # the spare's own failure, if any, goes there
            except OSError:
                pass
            env = {**pc.envs[lr], ENV_JOIN: str(decision["generation"])}
            new = spares.take(ready, env, list(pc.args[lr]))
            handler.proc = new
            worker_group.workers[lr].id = new.pid
            record["inProcess"] = [*record.get("inProcess", []), {**failure, "spare": new.pid}][-FAILURES_KEPT:]
            _say(f"in-process restart {decision['restarts']}/{in_process}: {describe(f)}; warm spare {new.pid} "
                 f"takes local rank {lr}")

    def give_up(agent, pending, report, count=None, k=None):
        agent._remaining_restarts = 0
        record.update(exhausted=True, permanent=bool(report.get("permanent")), last=pending, report=report)
        _say(f"giving up in-place recovery: {report['reason']}: {report['message']}")
        if count is not None:
            try:
                count.give_up(k, report)
            except Exception:  # noqa: BLE001 - the store gone with pod 0: this pod's own report stands
                pass

    def monitored(agent, worker_group):
        if in_process:
            replace_dead(agent, worker_group)
        result = monitor(agent, worker_group)
        if result.state not in {WorkerState.UNHEALTHY, WorkerState.FAILED}:
            alive["at"] = time.time()
            if spares is not None and not spares.started and os.path.exists(checkpointed_path):
                spares.start(worker_group.spec.entrypoint, list(agent._pcontext.args[0]))  # after a checkpoint
            return result
        failures = [_failure(f) for f in result.failures.values()]
        k = record["restarts"]  # the job's count when this round began
        for f in failures:
            record["failures"] = [*record["failures"], {**f, "round": k}][-FAILURES_KEPT:]
        pending = {"failures": failures, "detectedAt": time.time()}
        record["pending"] = pending
        if failures and all(f["exitCode"] == DELIBERATE_EXIT for f in failures):
            agent._remaining_restarts = 0  # the engine refused its input: no restart can fix it
            return result
        cause = _cause(failures) or {"localRank": "?", "exitCode": None, "error": None}
        try:  # taken: the next failure is judged on the steps trained after this one
            os.unlink(trained_path)
            trained = True
        except FileNotFoundError:
            trained = False
        repeated = bool(cause["error"]) and cause["error"] == record.get("previousError") and not trained
        record["previousError"] = cause["error"]
        base = {"status": "Failed", **({"error": cause["error"]} if cause["error"] else {}),
                "exitCode": cause["exitCode"], "inPlaceRestarts": k, "podIndex": pod_index()}
        limit = f"(runPolicy.recovery.inPlaceRestarts {max_restarts})"
        count = None
        try:
            count = JobCount(worker_group)
            adopted = count.given_up(k)
            after = count.failed(k)
        except Exception as e:  # noqa: BLE001 - pod 0's store unreachable: no rendezvous could succeed either
            give_up(agent, pending, {**base, "reason": EXHAUSTED_REASON, "permanent": False,
                                     "message": f"{describe(cause)} after {k} in-place restart(s) {limit}; the job's "
                                                f"restart count in pod 0's rendezvous store is unreachable "
                                                f"({type(e).__name__}: {e})"[:2000]})
            return result
        if adopted:  # another pod gave up in this round first: the same cause in every pod's report
            give_up(agent, pending, adopted)
        elif repeated:
            give_up(agent, pending, {**base, "reason": REPEATED_REASON, "permanent": True,
                                     "message": f"{describe(cause)}: the same error as the failure before, with no "
                                                f"step trained since; not retried in place (in-place restarts used: "
                                                f"{k} of {max_restarts})"}, count, k)
        elif after > max_restarts:
            give_up(agent, pending, {**base, "reason": EXHAUSTED_REASON, "permanent": False,
                                     "message": f"{describe(cause)} after {k} in-place restart(s) {limit}"}, count, k)
        else:
            agent._remaining_restarts = max_restarts - k  # torchrun's own count follows the job's: it restarts
            pending["restart"] = after
            _say(f"in-place restart {after}/{max_restarts}: {describe(cause)}")
        return result

    def restarted(agent, worker_group):
        # no failure seen here: healthy workers, restarted because another pod's agent opened a new round
        last = record.pop("pending", None) or {"failures": [], "detectedAt": time.time()}
        k = last.get("restart")
        if k is None:
            try:
                k = JobCount(worker_group).current()
            except Exception:  # noqa: BLE001 - the rendezvous will say what is wrong with the store
                k = record["restarts"] + 1
            _say(f"in-place restart {k}/{max_restarts}: another pod's workers failed")
        record.update(restarts=k, last=last)
        agent._remaining_restarts = max(max_restarts - k, 0)  # TORCHELASTIC_RESTART_COUNT is then the job's count

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
    """The launcher's termination report when it gave up in-place recovery (None when it did not, or the failure
    was deliberate: the engine's own report stands). The operator reads it from the container's termination
    message:

    * ``reason`` ``InPlaceRecoveryExhausted`` (``permanent`` false: the next rung, a gang restart, may help) or
      ``RepeatedFailure`` (``permanent`` true: the same error again with no step trained in between);
    * ``message``: the failed worker's error line first when it left one (``AssertionError: ... (local rank 0, exit
      code 1) after 3 in-place restart(s) (runPolicy.recovery.inPlaceRestarts 3)``);
    * ``error`` (that line; absent when the worker left none, e.g. killed by a signal), ``exitCode`` (the worker's,
      as torchrun reports it: negative for a signal), ``inPlaceRestarts`` (the job's in-place restarts before it),
      ``podIndex`` (the pod whose worker failed: a pod that gave up because another one had carries its report)."""
    if not record.get("exhausted"):
        return None
    if record.get("report"):
        return record["report"]
    failures = (record.get("last") or {}).get("failures", [])
    cause = _cause(failures)
    return {"status": "Failed", "reason": EXHAUSTED_REASON, "permanent": False,
            "message": f"{describe(cause) if cause else 'a worker failed'} after {record['restarts']} in-place "
                       f"restart(s) (runPolicy.recovery.inPlaceRestarts {record['maxRestarts']})",
            **({"error": cause["error"]} if cause and cause.get("error") else {}),
            "exitCode": cause["exitCode"] if cause else None, "inPlaceRestarts": record["restarts"],
            "podIndex": pod_index()}
