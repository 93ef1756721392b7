"""How the operator copes with many jobs, and with one very large job, against a real control plane.

Each measurement starts a fresh control plane (``ascend_cluster.controlplane``: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler, etcd without fsync) in a temporary folder, installs the CRDs and runs the
operator as its own process (``ascend_operator.main run -A --standalone``) with the credentials its Helm chart
gives it: a token of its ServiceAccount, bound to the chart's rules (``ascend_cluster.cluster.operator_rbac``), so
every request of the operator is authorized by kube-apiserver's RBAC. The operator's requests are counted from
kube-apiserver's own audit log, whose policy records the operator's user alone (at Metadata level): a watch counts
once, when it starts, every other request when it is answered. This script's own requests go as the cluster's
admin and are not counted. The first line says which kube-apiserver the run measured.

``jobs`` mode (default N = 100 and 500): N two-pod AscendTrainJobs created at once from 8 client threads (in a
process of their own, as a real server's users are). Prints p50/p95 of apply -> all of the job's pods created, the
time until every job has a status (reconciled), the operator's resident memory (now and peak), and the CPU of the
operator, kube-apiserver, etcd and the clients a job.

``versus`` mode (default N = 100 and 500, ``--rounds`` 3): N two-pod AscendTrainJobs and N Indexed batch Jobs
(two pods each, the same image and requests) applied to one control plane in alternating rounds, A B A B ...: apply
-> both pods, kube-apiserver's, etcd's and the controller's CPU a job (the operator; kube-controller-manager for
the Jobs) and the controller's requests a job (the audit log records the Job controller's ServiceAccount too);
``--profile DIR`` keeps kube-apiserver's CPU profile of every round (the first 20 s of it) and prints the first's top.

``large`` mode (default 64, 256, 512 and 1024 nodes): one AscendTrainJob of N nodes, in four phases:

- create: apply -> N pods created, and the operator quiet;
- start-up: this script plays the kubelets, moving every pod through PodScheduled, Running and Ready (three
  status writes a pod, as a real node reports them) until the job is Running with N ready;
- gang restart: one pod deleted as a worker failure; the operator deletes the gang and creates it again. A
  2-node job applied at the same moment measures how long a small job waits for its pods meanwhile;
- lost in restart: a pod of that attempt fails, and the first pod of the next attempt is deleted while the others
  are still being created (a second fault during the recovery): until the new attempt is whole again.

For each phase: the operator's CPU seconds (user + system from /proc, not wall time: the machine is shared),
its peak RSS, its API requests by verb, and the time until it goes quiet (no request for QUIET_S; the quiet
period itself is not counted). There are no nodes and no pod runner: the jobs name a scheduler that does not run
(``schedulerName``), so kube-scheduler leaves their pods alone and they stay unbound, as a cluster's pods wait for
Volcano; only the operator's own work and the API server's are measured. Progress is followed through one watch
on pods, never by listing them.

    .venv/bin/python benchmarks/operator_scale.py jobs [N ...]
    .venv/bin/python benchmarks/operator_scale.py large [NODES ...]
    .venv/bin/python benchmarks/operator_scale.py versus [N ...] [--rounds 3] [--profile DIR]
"""
from __future__ import annotations

import argparse
import datetime
import functools
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
from ascend_cluster.cluster import OPERATOR_ACCOUNT, OPERATOR_TOKEN_S, operator_rbac
from ascend_cluster.controlplane import ControlPlane, write_kubeconfig
from ascend_cluster.resource_client import ResourceClient
from ascend_operator.client.rbac import LEADER_ELECTION_RULES, rules
from kubernetes import client, config

ROOT = Path(__file__).resolve().parents[1]
GROUP, VERSION, PLURAL = "ascendtrain.dev", "v1alpha1", "ascendtrainjobs"
JOB_LABEL, KIND_LABEL = "ascendtrain.dev/job-name", "ascendtrain.dev/job-kind"
OPERATOR_USER = "system:serviceaccount:{}:{}".format(*OPERATOR_ACCOUNT)
SCHEDULER = "operator-scale-benchmark"  # no such scheduler runs: the pods stay unbound, kube-scheduler ignores them
QUIET_S = 1.0
IDLE_S = 30.0  # jobs mode: how long the operator's idle CPU is measured once every job is reconciled
POLL_S = 0.02
CLK_TCK = os.sysconf("SC_CLK_TCK")
# The audit log's times are wall-clock; the benchmark's are monotonic.
WALL_TO_MONOTONIC = time.time() - time.monotonic()
JOB_CONTROLLER_USER = "system:serviceaccount:kube-system:job-controller"  # kube-controller-manager's Job controller


def _audit_policy(*users: str) -> dict:
    return {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
            "rules": [{"level": "Metadata", "users": list(users)}, {"level": "None"}]}
_announced = False


def _monotonic(timestamp: str) -> float:
    return datetime.datetime.fromisoformat(timestamp).timestamp() - WALL_TO_MONOTONIC


class AuditTally:
    """The operator's API requests by verb, from kube-apiserver's audit log as it is written (its policy records
    the operator's user alone): a watch counts at its ResponseStarted stage, every other request at its
    ResponseComplete. ``last_request``: when the latest non-watch request arrived; ``last_answered``: when the
    latest was answered; ``read_at``: when this reader last found the end of the log (all before it is counted)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.users: dict[str, Counter[str]] = {}  # user -> verb -> requests
        self.last_request = self.last_answered = self.read_at = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tail, daemon=True)
        self._thread.start()

    @property
    def verbs(self) -> Counter[str]:
        return self.users.setdefault(OPERATOR_USER, Counter())

    def _count(self, event: dict) -> None:
        verb, stage = event.get("verb"), event.get("stage")
        verbs = self.users.setdefault((event.get("user") or {}).get("username", ""), Counter())
        if verb == "watch":
            if stage == "ResponseStarted":
                with self._lock:
                    verbs[verb] += 1
        elif stage == "ResponseComplete":
            with self._lock:
                verbs[verb] += 1
            self.last_request = max(self.last_request, _monotonic(event["requestReceivedTimestamp"]))
            self.last_answered = max(self.last_answered, _monotonic(event["stageTimestamp"]))

    def _tail(self) -> None:
        handle, pending = None, b""
        while not self._stop.is_set():
            if handle is None:
                try:
                    handle = open(self.path, "rb")
                except FileNotFoundError:
                    self._stop.wait(POLL_S)
                    continue
            at = time.monotonic()
            chunk = handle.read()
            if chunk:
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    if line.strip():
                        self._count(json.loads(line))
                continue
            try:  # kube-apiserver rotates its audit log (100 MB): the rest is in a new file
                rotated = os.stat(self.path).st_ino != os.fstat(handle.fileno()).st_ino
            except FileNotFoundError:
                rotated = False
            if rotated:
                handle.close()
                handle, pending = None, b""
                continue
            self.read_at = at
            self._stop.wait(POLL_S)
        if handle is not None:
            handle.close()

    def snapshot(self, user: str = OPERATOR_USER) -> Counter[str]:
        with self._lock:
            return Counter(self.users.get(user) or {})

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class PodTally:
    """Pods by job from a watch stream (uid and phase per pod name), with a condition to wait on. kube-apiserver
    closes a watch whose reader falls behind (a 512-pod gang restart is thousands of events): the tally then lists
    the pods again and watches on from that list, as an informer does."""

    def __init__(self, plane: ControlPlane, namespace: str = "default", selector: str = KIND_LABEL,
                 job_label: str = JOB_LABEL) -> None:
        self.pods: dict[str, dict[str, tuple[str, bool]]] = {}  # job -> pod name -> (uid, ready)
        self.cond = threading.Condition()
        self._plane, self._path = plane, f"/api/v1/namespaces/{namespace}/pods"
        self._selector, self._job_label = selector, job_label
        self._conn: http.client.HTTPSConnection | None = None
        self._closed = False
        version = self._relist()
        threading.Thread(target=self._read, args=(version,), daemon=True).start()

    def _connect(self) -> http.client.HTTPSConnection:
        parsed = urlparse(self._plane.server)
        return http.client.HTTPSConnection(parsed.hostname, parsed.port, timeout=3600,
                                           context=self._plane._admin_tls())

    def _relist(self) -> str:
        """Replace the tally with a listing of the pods; returns its resourceVersion."""
        listing = json.loads(self._get(urlencode({"labelSelector": self._selector})).read())
        with self.cond:
            self.pods = {}
            for pod in listing["items"]:
                self._keep(pod)
            self.cond.notify_all()
        return listing["metadata"]["resourceVersion"]

    def _get(self, query: str) -> http.client.HTTPResponse:
        self._conn = self._connect()
        self._conn.request("GET", f"{self._path}?{query}")
        response = self._conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"pods: {response.status} {response.read()[:500]!r}")
        return response

    def _keep(self, pod: dict) -> None:
        meta = pod["metadata"]
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (pod.get("status") or {}).get("conditions") or [])
        self.pods.setdefault(meta["labels"][self._job_label], {})[meta["name"]] = (meta["uid"], ready)

    def _read(self, version: str) -> None:
        while not self._closed:
            try:
                stream = self._get(urlencode({"watch": "true", "labelSelector": self._selector, "resourceVersion": version,
                                              "timeoutSeconds": 24 * 3600, "allowWatchBookmarks": "true"}))
                for line in stream:
                    event = json.loads(line)
                    if event["type"] == "ERROR":  # e.g. 410 Gone: list again
                        break
                    version = event["object"]["metadata"].get("resourceVersion", version)
                    if event["type"] == "BOOKMARK":
                        continue
                    with self.cond:
                        if event["type"] == "DELETED":
                            meta = event["object"]["metadata"]
                            self.pods.get(meta["labels"][self._job_label], {}).pop(meta["name"], None)
                        else:
                            self._keep(event["object"])
                        self.cond.notify_all()
            except Exception:  # noqa: BLE001 - the stream was cut (by the server, or by close())
                pass
            if not self._closed:
                version = self._relist()

    def wait(self, predicate, timeout: float) -> float:
        """Seconds until ``predicate(pods)`` held (inf on timeout)."""
        start = time.monotonic()
        with self.cond:
            if self.cond.wait_for(lambda: predicate(self.pods), timeout):
                return time.monotonic() - start
        return float("inf")

    def close(self) -> None:
        self._closed = True
        if self._conn is not None and self._conn.sock is not None:  # wake the reader blocked on the stream
            self._conn.sock.shutdown(socket.SHUT_RDWR)
        if self._conn is not None:
            self._conn.close()


def _api_client(kubeconfig: str) -> client.ApiClient:
    """The benchmark's own client, as the cluster's admin (not the operator's user: not counted)."""
    conf = client.Configuration()
    config.load_kube_config(kubeconfig, client_configuration=conf)
    conf.connection_pool_maxsize = 16
    return client.ApiClient(conf)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


class Operator:
    """The operator as its own process against a fresh control plane whose audit log records its requests."""

    def __init__(self, tmp: Path, audited: tuple[str, ...] = (OPERATOR_USER,), profiling: bool = False) -> None:
        global _announced
        (tmp / "cluster").mkdir()
        self.plane = ControlPlane(tmp / "cluster", fast_storage=True, audit_policy=_audit_policy(*audited),
                                  profiling=profiling, say=functools.partial(print, file=sys.stderr)).start()
        self.tally: PodTally | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._log = open(tmp / "operator.log", "w")
        try:
            if not _announced:
                version = self.plane.request("/version")
                print(f"kube-apiserver {version['gitVersion']} ({version['goVersion']}, {version['platform']}), "
                      f"etcd without fsync", flush=True)
                _announced = True
            self.kubeconfig = str(self.plane.kubeconfig)
            self.counting = AuditTally(self.plane.audit_log)
            with ResourceClient(self.kubeconfig) as resources:
                names = []
                for path in sorted((ROOT / "crds").glob("*.yaml")):
                    for doc in yaml.safe_load_all(path.read_text()):
                        if doc and doc.get("kind") == "CustomResourceDefinition":
                            resources.apply(doc)
                            names.append(doc["metadata"]["name"])
                resources.wait_established(names)
                operator_kubeconfig = self._operator_kubeconfig(resources, tmp)
            self.api = _api_client(self.kubeconfig)
            self.custom, self.core = client.CustomObjectsApi(self.api), client.CoreV1Api(self.api)
            self.tally = PodTally(self.plane)
            env = dict(os.environ, KUBECONFIG=str(operator_kubeconfig), ASCEND_OPERATOR_METRICS_PORT="0",
                       ASCEND_OPERATOR_DASHBOARD_PORT="0")
            self.process = subprocess.Popen([sys.executable, "-m", "ascend_operator.main", "run", "-A",
                                             "--standalone"], env=env, stdout=self._log, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 120  # the operator starts: its watches open, then it goes quiet
            while self.counting.verbs["watch"] < 4 and time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"the operator exited with {self.process.returncode}; see {tmp}/operator.log")
                time.sleep(0.2)
            self.until_quiet(time.monotonic())
        except BaseException:
            self.close()
            raise

    def _operator_kubeconfig(self, resources: ResourceClient, tmp: Path) -> Path:
        """A token of the operator's ServiceAccount, bound to the Helm chart's rules (as ``LocalCluster`` does)."""
        namespace, name = OPERATOR_ACCOUNT
        for obj in operator_rbac(namespace, name, rules(), LEADER_ELECTION_RULES):
            resources.apply(obj)
        token = resources.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                                  {"spec": {"expirationSeconds": OPERATOR_TOKEN_S}})["status"]["token"]
        return write_kubeconfig(tmp / "operator-kubeconfig", self.plane.server, self.plane.pki.ca.cert,
                                OPERATOR_USER, token, namespace)

    def cpu_s(self) -> float:
        assert self.process is not None
        return _cpu_s(self.process.pid)

    def component_cpu_s(self, name: str) -> float:
        """CPU seconds so far of one of the control plane's processes (kube-apiserver, etcd, ...)."""
        pids = {c.name: c.process.pid for c in self.plane.components if c.process is not None}
        return _cpu_s(pids[name])

    def component_rss_mib(self, name: str) -> float:
        pids = {c.name: c.process.pid for c in self.plane.components if c.process is not None}
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pids[name]}/status").read_text().splitlines()
                      if ":" in line)
        return int(status["VmRSS"].split()[0]) / 1024

    def server_cpu_s(self) -> tuple[float, float]:
        """CPU seconds of kube-apiserver and of etcd so far."""
        return self.component_cpu_s("kube-apiserver"), self.component_cpu_s("etcd")

    def rss_mib(self) -> tuple[float, float]:
        assert self.process is not None
        status = Path(f"/proc/{self.process.pid}/status").read_text().splitlines()
        fields = dict(line.split(":", 1) for line in status if ":" in line)
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024

    def apply(self, name: str, nnodes: int) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, _job_body(name, nnodes))

    def job_status(self, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name).get("status") or {}

    def until_quiet(self, since: float, timeout: float = 900) -> float:
        """Seconds from ``since`` to the operator's last request before QUIET_S without one (counted from when the
        latest request was answered to where the audit log has been read)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            counting = self.counting
            idle = counting.read_at - counting.last_answered
            if idle >= QUIET_S:
                return max(0.0, counting.last_request - since)
            time.sleep(max(0.0, QUIET_S - idle) + 0.05)
        return float("inf")

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)
        self._log.close()
        if self.tally is not None:
            self.tally.close()
        self.plane.stop()
        if hasattr(self, "counting"):
            self.counting.close()


class Phase:
    """CPU, requests and peak memory of the operator over one phase."""

    def __init__(self, op: Operator, name: str) -> None:
        self.op, self.name = op, name
        self.cpu0, self.verbs0, self.start = op.cpu_s(), op.counting.snapshot(), time.monotonic()
        self.server0 = op.component_cpu_s("kube-apiserver")

    def report(self, quiet_s: float, extra: str = "") -> None:
        verbs = self.op.counting.snapshot()
        verbs.subtract(self.verbs0)
        requests = " ".join(f"{v}={n}" for v, n in sorted(verbs.items()) if n)
        _, peak = self.op.rss_mib()
        server = self.op.component_cpu_s("kube-apiserver") - self.server0
        print(f"  {self.name:<13} operator CPU {self.op.cpu_s() - self.cpu0:6.2f} s   kube-apiserver CPU "
              f"{server:6.2f} s   quiet after {quiet_s:6.2f} s   peak RSS {peak:4.0f} MiB   requests {requests}{extra}",
              flush=True)


def _done(response) -> None:
    """Read a raw (not deserialized) answer, so that its connection goes back to the pool."""
    response.data  # noqa: B018 - reads the body
    response.release_conn()


def _kubelet(op: Operator, pods: list[str], status: dict) -> None:
    """Write one status to every pod, 8 at a time, as the nodes' kubelets would."""
    def write(name: str) -> None:
        _done(op.core.patch_namespaced_pod_status(name, "default", {"status": status}, _preload_content=False))
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
            _lost_in_restart(op, name, nodes)
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
    _done(op.core.delete_namespaced_pod(f"{name}-1-0", "default", _preload_content=False))  # attempt 0
    op.apply("small", 2)
    small = op.tally.wait(lambda pods: len(pods.get("small", {})) == 2, 600)
    renewed = op.tally.wait(lambda pods: len(pods.get(name, {})) == nodes and not
                            old & {uid for uid, _ in pods[name].values()}, 900)
    quiet = op.until_quiet(phase.start)
    status = op.job_status(name)
    phase.report(quiet, f"   (gang recreated in {renewed + small:.2f} s, restarts {status.get('restarts')}; "
                        f"small job's pods in {small:.2f} s)")


def _lost_in_restart(op: Operator, name: str, nodes: int) -> None:
    """A second fault during a recovery (issue 49's stuck gang, at scale): a pod of the current attempt fails, and
    the first pod of the attempt the operator then creates is deleted while the rest are still being created. The
    phase ends when the new attempt has all N pods again (the deleted one replaced) and the operator is quiet."""
    phase = Phase(op, "lost in restart")
    attempt = int(op.job_status(name).get("restarts", 0))
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # it ran, then failed: a pod that never ran is
    failed = {"state": {"terminated": {"exitCode": 137, "reason": "Error", "startedAt": at, "finishedAt": at}}}
    _kubelet(op, [f"{name}-1-{attempt}"], {"phase": "Running", "podIP": "10.0.0.1",  # replaced in place instead
                                           "containerStatuses": [{"name": "engine", "ready": True,
                                                                  "state": {"running": {"startedAt": at}}}]})
    _kubelet(op, [f"{name}-1-{attempt}"], {"phase": "Failed", "containerStatuses": [{"name": "engine", **failed}]})
    first = f"{name}-0-{attempt + 1}"
    op.tally.wait(lambda pods: first in pods.get(name, {}), 600)
    lost_uid = op.tally.pods[name][first][0]
    _done(op.core.delete_namespaced_pod(first, "default", _preload_content=False))
    suffix = f"-{attempt + 1}"

    def whole(pods: dict) -> bool:
        mine = pods.get(name, {})
        current = [n for n in mine if n.endswith(suffix)]
        return len(current) == nodes and mine[first][0] != lost_uid

    renewed = op.tally.wait(whole, 900)
    quiet = op.until_quiet(phase.start)
    status = op.job_status(name)
    stale = [n for n in op.tally.pods.get(name, {}) if not n.endswith(suffix)]
    phase.report(quiet, f"   (attempt {attempt + 1} whole again in {renewed:.2f} s, {len(stale)} older pod(s) "
                        f"left, restarts {status.get('restarts')}, phase {status.get('phase')})")


def _job_body(name: str, nnodes: int) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AscendTrainJob", "metadata": {"name": name},
            "spec": {"image": "engine:bench", "nnodes": nnodes, "runPolicy": {"backoffLimit": 10},
                     "schedulerName": SCHEDULER,
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
            spawn = multiprocessing.get_context("spawn")  # no fork of a process with threads
            go, (results, sender) = spawn.Event(), spawn.Pipe(duplex=False)
            clients = spawn.Process(target=_apply_clients, args=(op.kubeconfig, n, nnodes, go, sender))
            clients.start()
            phase = Phase(op, f"{n} jobs")
            server_cpu0 = op.server_cpu_s()
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
            cpu = op.cpu_s() - phase.cpu0
            apiserver_cpu, etcd_cpu = (now - before for now, before in zip(op.server_cpu_s(), server_cpu0))
            verbs = op.counting.snapshot()
            verbs.subtract(phase.verbs0)
            p95 = latencies[int(0.95 * (len(latencies) - 1))] if latencies else float("nan")
            print(f"N={n:4d} jobs ({n * nnodes} pods): applied in {apply_s:.1f}s; "
                  f"apply -> all pods created p50 {statistics.median(latencies):.2f}s p95 {p95:.2f}s "
                  f"({len(latencies)}/{n} jobs); all reconciled after "
                  f"{(reconciled_at or float('nan')) - start:.1f}s; operator RSS {rss:.0f} MiB (peak {peak:.0f} MiB), "
                  f"CPU {cpu:.1f} s ({1000 * cpu / n:.1f} ms a job; API server {1000 * apiserver_cpu / n:.1f} ms a "
                  f"job, etcd {1000 * etcd_cpu / n:.1f} ms a job, clients {1000 * clients_cpu / n:.1f} ms a job); "
                  f"operator requests a job "
                  + " ".join(f"{v}={c / n:.2f}" for v, c in sorted(verbs.items()) if c)
          + f"; kube-apiserver RSS {op.component_rss_mib('kube-apiserver'):.0f} MiB", flush=True)
            op.until_quiet(time.monotonic())
            cpu0, idle0 = op.cpu_s(), time.monotonic()
            time.sleep(IDLE_S)  # the jobs stay pending (no scheduler places their pods): nothing is due
            idle = op.cpu_s() - cpu0
            print(f"  idle with {n} pending jobs: operator CPU {idle:.2f} s in {time.monotonic() - idle0:.0f} s "
                  f"({100 * idle / (time.monotonic() - idle0):.2f}% of a core)", flush=True)
        finally:
            op.close()


def _batch_job_body(name: str, nnodes: int) -> dict:
    """An Indexed batch/v1 Job of ``nnodes`` pods: the same image, requests and unrunnable scheduler as the
    AscendTrainJob's CPU pods (what the operator adds of its own, torchrun's environment and the engine config's
    volume, a Job's pods have no use for)."""
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"completions": nnodes, "parallelism": nnodes, "completionMode": "Indexed", "backoffLimit": 10,
                     "template": {"spec": {"restartPolicy": "Never", "schedulerName": SCHEDULER, "containers": [
                         {"name": "engine", "image": "engine:bench", "command": ["ascend-engine", "train"],
                          "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]}}}}


def _cpu_job_body(name: str, nnodes: int) -> dict:
    body = _job_body(name, nnodes)
    body["spec"].update(devices={"resource": "none"}, resources={"requests": {"cpu": "500m", "memory": "1Gi"}})
    return body


KINDS = {  # kind -> (create(api, namespace, body), body(name, nnodes), pod selector, the pods' job label, controller)
    "AscendTrainJob": (lambda api, ns, body: client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, body, _preload_content=False), _cpu_job_body, KIND_LABEL, JOB_LABEL,
        OPERATOR_USER),
    "Job": (lambda api, ns, body: client.BatchV1Api(api).create_namespaced_job(ns, body, _preload_content=False),
            _batch_job_body, "batch.kubernetes.io/job-name", "batch.kubernetes.io/job-name", JOB_CONTROLLER_USER),
}


def _apply_kind(kubeconfig: str, kind: str, namespace: str, n: int, nnodes: int, go, results) -> None:
    """``_apply_clients`` for either kind, into ``namespace``."""
    create, body, *_ = KINDS[kind]
    api = _api_client(kubeconfig)
    applied: dict[str, float] = {}

    def apply(i: int) -> None:
        name = f"job-{i:04d}"
        _done(create(api, namespace, {**body(name, nnodes)}))
        applied[name] = time.monotonic()

    with ThreadPoolExecutor(8) as pool:
        client.CoreV1Api(api).list_namespaced_pod(namespace)  # connections warm
        go.wait()
        cpu0, start = time.process_time(), time.monotonic()
        list(pool.map(apply, range(n)))
    results.send((applied, start, time.monotonic() - start, time.process_time() - cpu0))


def _profile(op: Operator, seconds: int, path: Path) -> threading.Thread:
    """kube-apiserver's CPU profile (/debug/pprof/profile) over the next ``seconds``, written to ``path``."""
    def take() -> None:
        parsed = urlparse(op.plane.server)
        conn = http.client.HTTPSConnection(parsed.hostname, parsed.port, timeout=seconds + 60,
                                           context=op.plane._admin_tls())
        conn.request("GET", f"/debug/pprof/profile?seconds={seconds}")
        path.write_bytes(conn.getresponse().read())
    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    return thread


def _round(op: Operator, kind: str, n: int, nnodes: int, label: str, profile: Path | None) -> dict[str, float]:
    """N jobs of ``kind`` applied at once into a namespace of their own; the figures of that round."""
    *_, selector, job_label, controller = KINDS[kind]
    namespace = f"{kind.lower()}-{label.lower()}"
    op.plane.request("/api/v1/namespaces", "POST", {"metadata": {"name": namespace}})
    while True:  # the namespace's default ServiceAccount, made by kube-controller-manager
        try:
            op.plane.request(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
            break
        except Exception:  # noqa: BLE001
            time.sleep(0.1)
    tally = PodTally(op.plane, namespace, selector, job_label)
    op.until_quiet(time.monotonic())
    spawn = multiprocessing.get_context("spawn")
    go, (results, sender) = spawn.Event(), spawn.Pipe(duplex=False)
    clients = spawn.Process(target=_apply_kind, args=(op.kubeconfig, kind, namespace, n, nnodes, go, sender))
    clients.start()
    time.sleep(1.0)  # the clients' process imports the client and warms its connections
    pids = "operator" if controller == OPERATOR_USER else "kube-controller-manager"
    controller_cpu = op.cpu_s if pids == "operator" else (lambda: op.component_cpu_s("kube-controller-manager"))
    cpu0 = {"apiserver": op.component_cpu_s("kube-apiserver"), "etcd": op.component_cpu_s("etcd"),
            "controller": controller_cpu()}
    verbs0 = op.counting.snapshot(controller)
    profiler = _profile(op, 20, profile) if profile else None
    go.set()
    applied, start, apply_s, _ = results.recv()
    clients.join()
    created: dict[str, float] = {}

    def complete(pods: dict) -> bool:
        at = time.monotonic()
        for job, of_job in pods.items():
            if len(of_job) == nnodes and job not in created:
                created[job] = at
        return len(created) == n
    tally.wait(complete, 900)
    quiet = op.until_quiet(start)
    tally.close()
    latencies = sorted(created[j] - applied[j] for j in created)
    verbs = op.counting.snapshot(controller)
    verbs.subtract(verbs0)
    figures = {"p50": statistics.median(latencies), "p95": latencies[int(0.95 * (len(latencies) - 1))],
               "apply_s": apply_s, "quiet_s": quiet,
               "apiserver_ms": 1000 * (op.component_cpu_s("kube-apiserver") - cpu0["apiserver"]) / n,
               "etcd_ms": 1000 * (op.component_cpu_s("etcd") - cpu0["etcd"]) / n,
               "controller_ms": 1000 * (controller_cpu() - cpu0["controller"]) / n,
               "requests": sum(verbs.values()) / n}
    print(f"  {label:<3} {kind:<14} N={n}: applied in {figures['apply_s']:5.1f} s; apply -> pods p50 "
          f"{figures['p50']:6.2f} s p95 {figures['p95']:6.2f} s; per job: kube-apiserver {figures['apiserver_ms']:5.1f} "
          f"ms, etcd {figures['etcd_ms']:4.1f} ms, controller {figures['controller_ms']:5.1f} ms, requests "
          + " ".join(f"{v}={c / n:.2f}" for v, c in sorted(verbs.items()) if c), flush=True)
    if profiler is not None:
        profiler.join()
    op.plane.request(f"/api/v1/namespaces/{namespace}", "DELETE")
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:  # gone (its pods' finalizers released), so the next round starts clean
        try:
            op.plane.request(f"/api/v1/namespaces/{namespace}")
            time.sleep(1)
        except Exception:  # noqa: BLE001 - 404: gone
            break
    op.until_quiet(time.monotonic())
    return figures


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def versus(n: int, rounds: int, profile_dir: Path | None, nnodes: int = 2) -> None:
    """AscendTrainJobs (the operator) against Indexed batch Jobs (kube-controller-manager's Job controller) on one
    control plane, A B A B ..., ``rounds`` of each."""
    with tempfile.TemporaryDirectory() as tmp:
        op = Operator(Path(tmp), audited=(OPERATOR_USER, JOB_CONTROLLER_USER), profiling=profile_dir is not None)
        try:
            print(f"N={n} jobs of {nnodes} pods, {rounds} rounds of each kind, interleaved:", flush=True)
            results: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
            for r in range(rounds):
                for kind in KINDS:
                    profile = profile_dir / f"{kind}-{n}-{r + 1}.pprof" if profile_dir else None
                    results[kind].append(_round(op, kind, n, nnodes, f"{'AB'[list(KINDS).index(kind)]}{r + 1}",
                                                profile))
            print("  median [min-max]:", flush=True)
            for key, what in (("p50", "apply -> pods p50 (s)"), ("p95", "apply -> pods p95 (s)"),
                              ("apiserver_ms", "kube-apiserver CPU a job (ms)"), ("etcd_ms", "etcd CPU a job (ms)"),
                              ("controller_ms", "controller CPU a job (ms)"), ("requests", "controller requests a job")):
                ours, theirs = ([r[key] for r in results[kind]] for kind in KINDS)
                ratio = statistics.median(ours) / statistics.median(theirs) if statistics.median(theirs) else float("nan")
                print(f"    {what:<32} AscendTrainJob {_spread(ours):<22} Job {_spread(theirs):<22} "
                      f"ratio {ratio:.2f}", flush=True)
            if profile_dir:
                binary = op.plane.binary("kube-apiserver")
                for kind in KINDS:
                    print(f"  kube-apiserver's profile while the first round's {kind}s were applied "
                          f"({profile_dir}/{kind}-{n}-1.pprof; one file a round):")
                    top = subprocess.run(["go", "tool", "pprof", "-top", "-nodecount=30", str(binary),
                                          str(profile_dir / f"{kind}-{n}-1.pprof")], capture_output=True, text=True)
                    print(top.stdout[-6000:] or top.stderr[-2000:], flush=True)
        finally:
            op.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("jobs", "large", "versus"), nargs="?", default="jobs")
    parser.add_argument("--rounds", type=int, default=3, help="versus mode: rounds of each kind (A B A B ...)")
    parser.add_argument("--profile", type=Path, help="versus mode: a folder for kube-apiserver's CPU profiles of "
                                                     "each round (go tool pprof's top of the first is printed)")
    parser.add_argument("--no-start-up", action="store_true",
                        help="large mode: restart the gang while its pods are still Pending (saves the 3N writes)")
    parser.add_argument("sizes", nargs="*", type=int,
                        help="jobs mode: how many 2-node jobs to apply at once (default 100 500); "
                             "large mode: nodes of the one job (default 64 256 512 1024)")
    args = parser.parse_intermixed_args(argv)
    if args.mode == "jobs":
        for n in args.sizes or [100, 500]:
            jobs(n)
    elif args.mode == "versus":
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
        for n in args.sizes or [100, 500]:
            versus(n, args.rounds, args.profile)
    else:
        for n in args.sizes or [64, 256, 512, 1024]:
            large(n, startup=not args.no_start_up)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
