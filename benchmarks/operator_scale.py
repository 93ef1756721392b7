"""How the operator copes with many jobs, and with one very large job, against the loopback API server.

``jobs`` mode (default N = 100 and 500): a fresh API server, the operator as its own process, N two-pod
AscendTrainJobs created at once from 8 client threads (in a process of their own, as a real server's users are).
Prints p50/p95 of apply -> all of the job's pods created, the time until every job has a status (reconciled),
and the operator's resident memory (now and peak).

``large`` mode (default 64, 256, 512 and 1024 nodes): one AscendTrainJob of N nodes, in three phases:

- create: apply -> N pods created, and the operator quiet;
- start-up: this script plays the kubelets, moving every pod through PodScheduled, Running and Ready (three
  status writes a pod, as a real node reports them) until the job is Running with N ready;
- gang restart: one pod deleted as a worker failure; the operator deletes the gang and creates it again. A
  2-node job applied at the same moment measures how long a small job waits for its pods meanwhile.

For each phase: the operator's CPU seconds (user + system from /proc, not wall time: the machine is shared),
its peak RSS, its API requests by verb, and the time until it goes quiet (no request for QUIET_S; the quiet
period itself is not counted). There is no pod runner: only the operator's own work and the API server's are
measured. Progress is followed through one watch on pods, never by listing them.

    .venv/bin/python benchmarks/operator_scale.py jobs [N ...]
    .venv/bin/python benchmarks/operator_scale.py large [NODES ...]
"""
from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlencode, urlparse

import yaml
from kubernetes import client, config

from ascend_operator.local import apiserver

ROOT = Path(__file__).resolve().parents[1]
GROUP, VERSION, PLURAL = "ascendtrain.dev", "v1alpha1", "ascendtrainjobs"
JOB_LABEL, KIND_LABEL = "ascendtrain.dev/job-name", "ascendtrain.dev/job-kind"
AGENT = "operator-scale-benchmark"
QUIET_S = 1.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


class CountingApi(apiserver.LocalKubernetesApi):
    """The emulated API server, counting the operator's requests by verb (the benchmark's own are not counted)."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.verbs: Counter[str] = Counter()
        self.last_request = time.monotonic()

    async def __call__(self, raw):  # type: ignore[override]
        if raw.headers.get("User-Agent") != AGENT:
            target = apiserver.parse_target(raw.path)
            method = raw.method.upper()
            if method == "GET":
                verb = "watch" if raw.query.get("watch") in ("true", "1") else \
                    "get" if target is not None and target.name else "list"
            else:
                verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, method)
            self.verbs[verb] += 1
            if verb != "watch":
                self.last_request = time.monotonic()
        return await super().__call__(raw)


class PodTally:
    """Pods by job from one watch stream (uid and phase per pod name), with a condition to wait on."""

    def __init__(self, url: str, namespace: str = "default") -> None:
        self.pods: dict[str, dict[str, tuple[str, bool]]] = {}  # job -> pod name -> (uid, ready)
        self.cond = threading.Condition()
        parsed = urlparse(url)
        self._conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=3600)
        query = urlencode({"watch": "true", "labelSelector": KIND_LABEL})
        self._conn.request("GET", f"/api/v1/namespaces/{namespace}/pods?{query}", headers={"User-Agent": AGENT})
        self._response = self._conn.getresponse()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for line in self._response:
                event = json.loads(line)
                pod = event["object"]
                meta = pod["metadata"]
                job = meta["labels"][JOB_LABEL]
                ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                            for c in (pod.get("status") or {}).get("conditions") or [])
                with self.cond:
                    if event["type"] == "DELETED":
                        self.pods.get(job, {}).pop(meta["name"], None)
                    else:
                        self.pods.setdefault(job, {})[meta["name"]] = (meta["uid"], ready)
                    self.cond.notify_all()
        except Exception:  # noqa: BLE001 - the stream ends when the run closes it, mid-chunk
            pass

    def wait(self, predicate, timeout: float) -> float:
        """Seconds until ``predicate(pods)`` held (inf on timeout)."""
        start = time.monotonic()
        with self.cond:
            if self.cond.wait_for(lambda: predicate(self.pods), timeout):
                return time.monotonic() - start
        return float("inf")

    def close(self) -> None:
        if self._conn.sock is not None:  # wake the reader thread blocked on the stream
            self._conn.sock.shutdown(socket.SHUT_RDWR)
        self._conn.close()


def _api_client(kubeconfig: str) -> client.ApiClient:
    """The benchmark's own client (its requests are not counted as the operator's: AGENT)."""
    conf = client.Configuration()
    config.load_kube_config(kubeconfig, client_configuration=conf)
    conf.connection_pool_maxsize = 16
    api = client.ApiClient(conf)
    api.user_agent = AGENT
    return api


class Operator:
    """The operator as its own process against a fresh counting API server."""

    def __init__(self, tmp: Path) -> None:
        apiserver.LocalKubernetesApi, original = CountingApi, apiserver.LocalKubernetesApi
        try:
            self.server = apiserver.LocalApiServer().start()
        finally:
            apiserver.LocalKubernetesApi = original
        kubeconfig = self.server.write_kubeconfig(tmp / "kubeconfig")
        self.api = _api_client(str(kubeconfig))
        ext = client.ApiextensionsV1Api(self.api)
        for path in sorted((ROOT / "crds").glob("*.yaml")):
            ext.create_custom_resource_definition(yaml.safe_load(path.read_text()))
        self.custom, self.core = client.CustomObjectsApi(self.api), client.CoreV1Api(self.api)
        self.tally = PodTally(self.server.url)
        env = dict(os.environ, KUBECONFIG=str(kubeconfig), ASCEND_OPERATOR_METRICS_PORT="0",
                   ASCEND_OPERATOR_DASHBOARD_PORT="0")
        self._log = open(tmp / "operator.log", "w")
        self.process = subprocess.Popen([sys.executable, "-m", "ascend_operator.main", "run", "-A", "--standalone"],
                                        env=env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120  # the operator starts: its watches open, then it goes quiet
        while self.counting.verbs["watch"] < 4 and time.monotonic() < deadline:
            time.sleep(0.2)
        self.until_quiet(time.monotonic())

    @property
    def counting(self) -> CountingApi:
        return self.server.api  # type: ignore[return-value]

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime

    def rss_mib(self) -> tuple[float, float]:
        status = Path(f"/proc/{self.process.pid}/status").read_text().splitlines()
        fields = dict(line.split(":", 1) for line in status if ":" in line)
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024

    def apply(self, name: str, nnodes: int) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, _job_body(name, nnodes))

    def job_status(self, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name).get("status") or {}

    def until_quiet(self, since: float, timeout: float = 900) -> float:
        """Seconds from ``since`` to the operator's last request before QUIET_S without one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            idle = time.monotonic() - self.counting.last_request
            if idle >= QUIET_S:
                return max(0.0, self.counting.last_request - since)
            time.sleep(QUIET_S - idle + 0.05)
        return float("inf")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(30)
        self._log.close()
        self.tally.close()
        self.server.stop()


class Phase:
    """CPU, requests and peak memory of the operator over one phase."""

    def __init__(self, op: Operator, name: str) -> None:
        self.op, self.name = op, name
        self.cpu0, self.verbs0, self.start = op.cpu_s(), Counter(op.counting.verbs), time.monotonic()

    def report(self, quiet_s: float, extra: str = "") -> None:
        verbs = Counter(self.op.counting.verbs)
        verbs.subtract(self.verbs0)
        requests = " ".join(f"{v}={n}" for v, n in sorted(verbs.items()) if n)
        _, peak = self.op.rss_mib()
        print(f"  {self.name:<13} operator CPU {self.op.cpu_s() - self.cpu0:6.2f} s   quiet after {quiet_s:6.2f} s   "
              f"peak RSS {peak:4.0f} MiB   requests {requests}{extra}", flush=True)


def _kubelet(op: Operator, pods: list[str], status: dict) -> None:
    """Write one status to every pod, 8 at a time, as the nodes' kubelets would."""
    def write(name: str) -> None:
        op.core.patch_namespaced_pod_status(name, "default", {"status": status}, _preload_content=False)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, pods))


def _conditions(**states: str) -> list[dict]:
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return [{"type": t, "status": s, "lastTransitionTime": at} for t, s in states.items()]


def large(nodes: int, startup: bool = True) -> None:
    name = "big"
    with tempfile.TemporaryDirectory() as tmp:
        op = Operator(Path(tmp))
        try:
            print(f"{nodes} nodes:", flush=True)
            phase = Phase(op, "create")
            op.apply(name, nodes)
            created = op.tally.wait(lambda pods: len(pods.get(name, {})) == nodes, 600)
            phase.report(op.until_quiet(phase.start), f"   ({nodes} pods in {created:.2f} s)")

            if startup:
                _start_up(op, name)
            _gang_restart(op, name, nodes)
        finally:
            op.close()


def _start_up(op: Operator, name: str) -> None:
    phase = Phase(op, "start-up")
    pods = sorted(op.tally.pods[name])
    running = {"state": {"running": {"startedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}}
    _kubelet(op, pods, {"phase": "Pending", "conditions": _conditions(PodScheduled="True")})
    _kubelet(op, pods, {"phase": "Running", "podIP": "10.0.0.1",
                        "conditions": _conditions(PodScheduled="True", Ready="False"),
                        "containerStatuses": [{"name": "engine", "ready": False, **running}]})
    _kubelet(op, pods, {"phase": "Running", "podIP": "10.0.0.1",
                        "conditions": _conditions(PodScheduled="True", Ready="True"),
                        "containerStatuses": [{"name": "engine", "ready": True, **running}]})
    quiet = op.until_quiet(phase.start)
    status = op.job_status(name)
    phase.report(quiet, f"   (job {status.get('phase')}, {status.get('replicas', {}).get('ready')} ready)")


def _gang_restart(op: Operator, name: str, nodes: int) -> None:
    phase = Phase(op, "gang restart")
    old = {uid for uid, _ in op.tally.pods[name].values()}
    op.core.delete_namespaced_pod(f"{name}-1-0", "default", _preload_content=False)  # attempt 0
    op.apply("small", 2)
    small = op.tally.wait(lambda pods: len(pods.get("small", {})) == 2, 600)
    renewed = op.tally.wait(lambda pods: len(pods.get(name, {})) == nodes and not
                            old & {uid for uid, _ in pods[name].values()}, 900)
    quiet = op.until_quiet(phase.start)
    status = op.job_status(name)
    phase.report(quiet, f"   (gang recreated in {renewed + small:.2f} s, restarts {status.get('restarts')}; "
                        f"small job's pods in {small:.2f} s)")


def _job_body(name: str, nnodes: int) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AscendTrainJob", "metadata": {"name": name},
            "spec": {"image": "engine:bench", "nnodes": nnodes, "runPolicy": {"backoffLimit": 10},
                     "train": {"training": {"globalBatchSize": nnodes}}}}


def _apply_clients(kubeconfig: str, n: int, nnodes: int, go, results) -> None:
    """The users: 8 client threads in a process of their own (a real API server's clients are not in its process,
    and sharing its interpreter would make the server wait on them). Sends (apply times by job, seconds taken,
    process CPU seconds) once all are applied."""
    custom = client.CustomObjectsApi(_api_client(kubeconfig))
    applied: dict[str, float] = {}

    def apply(i: int) -> None:
        name = f"job-{i:04d}"
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, _job_body(name, nnodes))
        applied[name] = time.monotonic()

    with ThreadPoolExecutor(8) as pool:
        custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)  # connections and models warm
        go.wait()
        cpu0, start = time.process_time(), time.monotonic()
        list(pool.map(apply, range(n)))
    results.send((applied, start, time.monotonic() - start, time.process_time() - cpu0))


def jobs(n: int, nnodes: int = 2) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        op = Operator(Path(tmp))
        try:
            spawn = multiprocessing.get_context("spawn")  # no fork of a process with a server thread
            go, (results, sender) = spawn.Event(), spawn.Pipe(duplex=False)
            clients = spawn.Process(target=_apply_clients, args=(str(Path(tmp) / "kubeconfig"), n, nnodes, go,
                                                                 sender))
            clients.start()
            phase = Phase(op, f"{n} jobs")
            server_cpu0 = time.process_time()  # this process: the API server and the pod watch
            go.set()
            applied, start, apply_s, clients_cpu = results.recv()
            clients.join()
            all_pods: dict[str, float] = {}

            def complete(pods: dict) -> bool:
                t = time.monotonic()
                for job, of_job in pods.items():
                    if len(of_job) == nnodes and job not in all_pods:
                        all_pods[job] = t
                return len(all_pods) == n
            op.tally.wait(complete, 600)
            reconciled_at = None
            while time.monotonic() - start < 600:  # job statuses: one list of the jobs a second
                listed = op.custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)["items"]
                if sum(1 for j in listed if (j.get("status") or {}).get("phase")) == n:
                    reconciled_at = time.monotonic()
                    break
                time.sleep(1)
            latencies = sorted(all_pods[j] - applied[j] for j in all_pods)
            rss, peak = op.rss_mib()
            cpu, server_cpu = op.cpu_s() - phase.cpu0, time.process_time() - server_cpu0
            verbs = Counter(op.counting.verbs)
            verbs.subtract(phase.verbs0)
            p95 = latencies[int(0.95 * (len(latencies) - 1))] if latencies else float("nan")
            print(f"N={n:4d} jobs ({n * nnodes} pods): applied in {apply_s:.1f}s; "
                  f"apply -> all pods created p50 {statistics.median(latencies):.2f}s p95 {p95:.2f}s "
                  f"({len(latencies)}/{n} jobs); all reconciled after "
                  f"{(reconciled_at or float('nan')) - start:.1f}s; operator RSS {rss:.0f} MiB (peak {peak:.0f} MiB), "
                  f"CPU {cpu:.1f} s ({1000 * cpu / n:.1f} ms a job; API server {1000 * server_cpu / n:.1f} ms a "
                  f"job, clients {1000 * clients_cpu / n:.1f} ms a job); operator requests a job "
                  + " ".join(f"{v}={c / n:.2f}" for v, c in sorted(verbs.items()) if c), flush=True)
        finally:
            op.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("jobs", "large"), nargs="?", default="jobs")
    parser.add_argument("--no-start-up", action="store_true",
                        help="large mode: restart the gang while its pods are still Pending (saves the 3N writes)")
    parser.add_argument("sizes", nargs="*", type=int,
                        help="jobs mode: how many 2-node jobs to apply at once (default 100 500); "
                             "large mode: nodes of the one job (default 64 256 512 1024)")
    args = parser.parse_args(argv)
    if args.mode == "jobs":
        for n in args.sizes or [100, 500]:
            jobs(n)
    else:
        for n in args.sizes or [64, 256, 512, 1024]:
            large(n, startup=not args.no_start_up)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
