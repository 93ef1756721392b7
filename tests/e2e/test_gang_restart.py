"""A rank frozen mid-run on the local cluster (SIGSTOP: the process stays, its iteration stops): the operator
declares the job Stalled within runPolicy.stallDetection's timeout, the live rank's Python stacks reach its pod's
log and an event, and the whole gang is replaced (a gang restart with reason Stalled, counted); the engine resumes
from a checkpoint instead of starting over, and since the newest one was truncated meanwhile, from the previous one,
with a Warning event on the job that `kubectl get events` shows. (A killed pod's gang restart is
tests/operator/test_operator_lifecycle.py's; it ends in the same create-and-resume path as this one.)"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from ascend_cluster.cluster import LocalCluster

from mlflow_server import CLIENT_ENV, importable, mlflow_server, wait_ready  # noqa: E402
from workspace import create_workspace, quickstart_job  # noqa: E402

pytestmark = pytest.mark.e2e


STALL_TIMEOUT_S = 10  # runPolicy.stallDetection.timeoutSeconds (fixed: the derived one follows the machine's load)


def _operator_metrics_port(cluster: LocalCluster) -> int:
    """The port LocalCluster chose for the operator's own metrics (in the operator process's environment)."""
    environ = Path(f"/proc/{cluster.operator.pid}/environ").read_bytes().split(b"\0")
    return int(next(v for v in environ if v.startswith(b"ASCEND_OPERATOR_METRICS_PORT=")).split(b"=", 1)[1])


def _worker_pid(cluster: LocalCluster, namespace: str, pod: str) -> int:
    """The training process of a local pod: the engine process its torchrun started (torchrun puts each worker
    in a session of its own, so it is found by parentage, not by the pod's process group)."""
    launcher = cluster.runner._containers[(namespace, pod)].process.pid  # noqa: SLF001 - the pod's process
    parents, commands = {}, {}
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text()
            commands[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        parents[int(proc.name)] = int(stat[stat.rindex(")") + 2:].split()[1])

    def descends(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == launcher:
                return True
        return False

    workers = [pid for pid in parents if descends(pid) and "ascend_engine train" in commands.get(pid, "")]
    assert len(workers) == 1, {pid: commands.get(pid) for pid in parents if descends(pid)}
    return workers[0]


def test_frozen_rank_is_stalled_and_the_gang_resumes_from_the_previous_checkpoint(tmp_path):
    job = quickstart_job()
    job["metadata"]["name"] = "resume"
    train = job["spec"]["train"]
    train["training"]["trainIters"] = 150
    train["checkpoint"].update(save="/workspace/checkpoints/resume", saveInterval=5)
    train["observability"]["logInterval"] = 10
    job["spec"]["runPolicy"] = {"backoffLimit": 1, "stallDetection": {
        "timeoutSeconds": STALL_TIMEOUT_S, "checkpointSeconds": STALL_TIMEOUT_S, "startupSeconds": 300,
        "stackDumpSeconds": 4}}
    tracked = importable()  # the job's curves in a real MLflow server, one run across the gang restart
    phases: list[str] = []
    restarting: list[dict] = []
    iterations: set[int] = set()
    with (mlflow_server(tmp_path / "mlflow") if tracked else contextlib.nullcontext()) as tracking_uri, \
            LocalCluster(fast_storage=True, root=tmp_path / "cluster", operator=True) as cluster:
        if tracked:
            train["observability"]["trackers"] = [
                {"type": "mlflow", "trackingUri": tracking_uri, "experiment": "gang-restart"}]
            job["spec"]["env"] = [*job["spec"].get("env", []), *({"name": k, "value": v} for k, v in CLIENT_ENV.items())]
        create_workspace(cluster)
        resources = cluster.client()
        atj = resources.resolve("atj")
        if tracked:
            wait_ready(tracking_uri)  # started with the cluster; usually up by now
        resources.apply(job)

        def status():
            s = resources.get(atj, "resume", "default").get("status") or {}
            iterations.add((s.get("progress") or {}).get("iteration"))
            iterations.discard(None)
            if s.get("phase") and (not phases or phases[-1] != s["phase"]):
                phases.append(s["phase"])
                if s["phase"] == "Restarting":  # the condition's reason while restarting (success rewrites it)
                    restarting.append(next(c for c in s["conditions"] if c["type"] == "Restarting"))
            return s

        def wait(what, until, seconds):
            deadline = time.monotonic() + seconds
            while not until(s := status()):
                assert time.monotonic() < deadline, f"{what}: {s}"
                time.sleep(0.3)
            return s

        # Two checkpoints, the newest to damage and one to fall back to, early, so the run is far from its end; and
        # two iterations seen, so the operator is past its start-up floor (it counts advances it saw).
        wait("no checkpoint at 10 yet", lambda s: (s.get("progress") or {}).get("lastCheckpointIteration", 0) >= 10
             and len(iterations) >= 2, 300)
        os.kill(_worker_pid(cluster, "default", "resume-1-0"), signal.SIGSTOP)  # rank 1 freezes
        frozen_at = time.monotonic()
        # Hang detection's condition is Progressing=False (reason Stalled); kstatus' Stalled stays False (a hang
        # that a restart may cure is not a failed job).
        stalled = wait("not declared Stalled", lambda s: any(
            c["type"] == "Progressing" and c["status"] == "False" and c["reason"] == "Stalled"
            for c in s.get("conditions") or []), 120)
        seconds_to_stalled = time.monotonic() - frozen_at
        # Damage the newest checkpoint before the gang restarts (stackDumpSeconds later): cut its first file short.
        workspace = cluster.root / "pvc" / "default" / "ascend-workspace" / "checkpoints" / "resume"
        newest = int((workspace / "latest_checkpointed_iteration.txt").read_text())
        damaged = workspace / f"iter_{newest:07d}" / "mp_rank_00" / "model_optim_rng.pt"
        os.truncate(damaged, damaged.stat().st_size // 2)

        final = wait("did not finish", lambda s: s.get("phase") in ("Succeeded", "Failed"), 400)
        # Rank 0's log over both attempts (pods resume-0-0 and resume-0-1; the local runner keeps a deleted pod's).
        log = "".join((cluster.root / "pods" / "default" / f"resume-0-{a}" / "container.log").read_text()
                      for a in (0, 1))
        first_attempt = max(int(m) for m in re.findall(  # the last iteration the stalled attempt logged
            r"^ iteration\s+(\d+)/", (cluster.root / "pods" / "default" / "resume-0-0" / "container.log").read_text(),
            re.M))
        listed = _kubectl(cluster, "get", "pods", "-l", "ascendtrain.dev/job-name=resume", "-L",
                          "ascendtrain.dev/attempt")
        served = urllib.request.urlopen(f"http://127.0.0.1:{_operator_metrics_port(cluster)}/metrics",
                                        timeout=5).read().decode()
        events = _kubectl(cluster, "get", "events", "--field-selector", "involvedObject.name=resume")
        declared = sum(int(n) for n in _kubectl(  # every Stalled declaration: an event each, or a repeat's count
            cluster, "get", "events", "--field-selector", "involvedObject.name=resume,reason=Stalled", "-o",
            "jsonpath={.items[*].count}").split())
        resources.close()
        if tracked:
            from mlflow import MlflowClient

            client = MlflowClient(tracking_uri)
            run_id = final["tracking"][0]["runId"]
            losses = [m.step for m in client.get_metric_history(run_id, "loss")]
            run = client.get_run(run_id)
    assert final["phase"] == "Succeeded", final
    assert final["restarts"] == 1
    assert "Restarting" in phases and phases.index("Restarting") < len(phases) - 1, phases
    assert phases[-2:] == ["Running", "Succeeded"], phases
    assert final["progress"]["iteration"] == 150
    # Never before the timeout (counted from the last advance the operator saw, which may precede the freeze);
    # after the freeze within the timeout, the operator's 2 s reading interval and its reconcile (generous for a
    # loaded machine, and still far below the default floors of minutes).
    message = next(c for c in stalled["conditions"] if c["type"] == "Progressing")["message"]
    assert next(c for c in stalled["conditions"] if c["type"] == "Stalled")["status"] == "False", stalled
    # Both limits are STALL_TIMEOUT_S: rank 0 may be inside a save (every 5 iterations) when rank 1 freezes.
    found = re.search(r"no progress for (\d+)s \(timeout (\d+)s, stallDetection\.(timeoutSeconds|checkpointSeconds)",
                      message)
    assert found, message
    waited = int(found[1])
    assert waited >= STALL_TIMEOUT_S and "Python stacks" in message, message
    assert seconds_to_stalled <= STALL_TIMEOUT_S + 30, seconds_to_stalled
    assert len(restarting) == 1 and restarting[0]["reason"] == "Stalled", restarting
    assert restarting[0]["message"].startswith("gang restart 1/1: stalled: iteration "), restarting
    assert next(c for c in final["conditions"] if c["type"] == "Progressing")["status"] == "True"
    assert {c["type"]: c["status"] for c in final["conditions"] if c["type"] in ("Ready", "Reconciling", "Stalled")} \
        == {"Ready": "True", "Reconciling": "False", "Stalled": "False"}, final["conditions"]
    # The next attempt's pods have names of their own and completed; the stalled gang's running pods were stopped
    # (deleted; one that had ended first would stay, as a failed pod does).
    rows = {line.split()[0]: (line.split()[2], line.split()[-1]) for line in listed.splitlines()[1:]}
    assert {k: v for k, v in rows.items() if v[1] == "1"} == {"resume-0-1": ("Completed", "1"),
                                                              "resume-1-1": ("Completed", "1")}, listed
    assert all(v[1] == "0" and v[0] != "Running" for k, v in rows.items() if not k.endswith("-1")), listed
    # Rank 0's log: its stacks (faulthandler's dump of every thread) while
    # it waited for the frozen rank, then the second run loading the newest checkpoint that verifies.
    dump = log[log.index("stack dump requested"):]
    assert "most recent call first" in dump and 'File "' in dump, dump[:3000]
    loaded = [int(m.group(1)) for m in re.finditer(r"^loaded checkpoint \S+ at iteration (\d+)$", log, re.M)]
    assert len(loaded) == 1 and 5 <= loaded[0] < newest, log[-3000:]
    assert "WARNING checkpoint" in log and f"iteration {newest} is damaged" in log
    assert 'ascend_operator_gang_restarts_total{kind="AscendTrainJob",reason="Stalled"} 1.0' in served
    # The frozen gang's declaration, and on a loaded machine perhaps one more: the resumed attempt may go past the
    # fixed 10 s between two advances the operator sees, a declaration withdrawn at the next advance (the final
    # condition above is False, and there was one restart). The counter counts every declaration.
    assert declared >= 1 and f'ascend_operator_stalls_total{{kind="AscendTrainJob"}} {declared:.1f}' in served, \
        (declared, [line for line in served.splitlines() if "stalls" in line])
    # kubectl get events: the stall, rank 0's stacks, and the engine's checkpoint fallback.
    rows = [line.split(None, 4) for line in events.splitlines()[1:]]
    reasons = [row[2] for row in rows]
    assert reasons.count("Stalled") >= 1 and reasons.count("StackDump") >= 1, events
    fallback = [row for row in rows if row[2] == "CheckpointFallback"]
    assert len(fallback) == 1 and fallback[0][1] == "Warning", events
    assert f"iteration {newest} is damaged" in fallback[0][4] and f"resuming from iteration {loaded[0]}" in \
        fallback[0][4], events
    if tracked:
        # One MLflow run over both attempts (its id beside the checkpoints): every logged iteration of the job; the
        # steps after the checkpoint the second attempt loaded, logged by the first attempt too, appear twice.
        assert [t["tracker"] for t in final["tracking"]] == ["mlflow"] and final["tracking"][0]["url"].startswith(
            tracking_uri), final["tracking"]
        assert sorted(set(losses)) == list(range(10, 151, 10)), losses
        twice = sorted(step for step in set(losses) if losses.count(step) == 2)
        assert twice == [step for step in range(10, 151, 10) if loaded[0] < step <= first_attempt], (losses, loaded)
        assert all(losses.count(step) <= 2 for step in losses), losses
        assert run.info.status == "FINISHED" and run.data.params["training.trainIters"] == "150"
        # One event per attempt; kubectl lists events by when they were last seen, not in the order they happened.
        trackers = sorted(row[4].split(" at ")[0] for row in rows if row[2] == "TrackerRun")
        assert trackers == [f"mlflow run {run_id} continued", f"mlflow run {run_id} started"], events


def _kubectl(cluster: LocalCluster, *args: str) -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (`make tools` installs it)")
    env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig), HOME=str(cluster.root))
    out = subprocess.run([kubectl, *args], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout
