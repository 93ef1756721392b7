"""``PodRunner``: the node agent of one local node, a kubelet that runs containers as local processes.

It authenticates as ``system:node:<name>`` (so kube-apiserver's Node authorizer and NodeRestriction admission treat
it as a kubelet), registers its Node (capacity and allocatable: cpu, memory, pods and the configured device counts;
the Ready condition; the port of its kubelet API, ``kubelet_api``, which serves container logs to kube-apiserver),
renews its Lease in ``kube-node-lease`` and posts the Ready condition every ``heartbeat_interval``, polls for the
pods kube-scheduler bound to it, starts each pod's first container as a local process group (see
``pod_environment`` for env, volumes, service-account tokens and the path/DNS rewrites), and reports status the way
a kubelet does: Pending -> Running -> Succeeded/Failed, with restartPolicy honoured; a pod marked for deletion is
stopped (SIGTERM, then SIGKILL after its grace) and deleted for good. ``lose`` plays a node that dies: its processes
stop at once and it posts nothing more, so kube-controller-manager's node lifecycle controller finds it silent.

Differs from a kubelet: no images (the host's Python environment is the image), no init or sidecar containers
(only the first container runs), no probes, no cgroup limits (requests are only what the scheduler accounts),
every node shares the host's loopback network and files, and a heartbeat posts only the conditions (capacity and
allocatable are posted when the node registers, so a patch that lowers allocatable, as a device plugin's does
when a device turns unhealthy, stays until the node registers again).
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from .certificates import KeyPair
from .kubelet_api import KubeletApi
from .node_events import PodEvents
from .pod_environment import (ContainerPathView, IpAllocator, PodSetupError, container_launch, refresh_downward_api,
                              termination_message_file)
from .pod_network import POD_IP_ENV, PodNetwork, bind_shim, claim_network

logger = logging.getLogger(__name__)

MAX_LOCAL_GRACE_S = 3.0  # terminationGracePeriodSeconds is capped locally so that stopping stays quick
HOST_IP = "127.0.0.1"
LEASE_DURATION_S = 40  # the kubelet's nodeLeaseDurationSeconds
SETUP_RETRY_SECONDS = 1.0  # a pod whose ConfigMap, Secret or claim is missing is set up again this often


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def pod_log_path(root: Path, namespace: str, name: str) -> Path:
    return Path(root) / "pods" / namespace / name / "container.log"


def read_logs(root: Path, namespace: str, name: str) -> str:
    """The pod's container output (stdout and stderr, all restarts), as ``kubectl logs`` would show it."""
    path = pod_log_path(root, namespace, name)
    return ContainerPathView.of_pod(path.parent).text(path.read_text(errors="replace")) if path.exists() else ""


def node_capacity(devices: dict[str, int] | None = None) -> dict[str, str]:
    """What a node on this host offers: its cores and memory, 110 pods (the kubelet's default) and ``devices``."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 1024
    return {"cpu": str(os.cpu_count() or 1), "memory": f"{memory}Ki", "pods": "110",
            **{k: str(v) for k, v in (devices or {}).items()}}


@dataclass
class RunningContainer:
    pod_key: tuple[str, str]
    uid: str
    process: subprocess.Popen[bytes] | None
    started_at: str
    restart_count: int = 0
    restart_at: float | None = None  # monotonic time of the next start after a crash (back-off)
    last_terminated: dict[str, Any] | None = None
    kill_deadline: float | None = None
    finished: bool = False
    setup_error: str = ""  # why the container could not be set up on the last try (reported once per message)


class PodRunner:
    """Runs pods bound to ``node_name`` as local processes under ``root/pods/<ns>/<pod>/``."""

    def __init__(self, kubeconfig: str | Path, root: str | Path, node_name: str, serving: KeyPair, client_ca: Path,
                 capacity: dict[str, int] | None = None, poll_interval: float = 0.2,
                 network: tuple[PodNetwork, IpAllocator] | None = None, heartbeat_interval: float = 1.0,
                 labels: dict[str, str] | None = None):
        """``kubeconfig``: the node's own credentials; ``serving``/``client_ca``: its kubelet API's certificate and
        the CA its callers' certificates must come from; ``capacity``: device counts
        (``{"huawei.com/Ascend910": 8}``); ``network``: the cluster's loopback network and pod IPs, shared by its
        nodes (default: claim a network of its own); ``labels``: more labels for the Node (a kubelet's
        ``--node-labels``)."""
        self.root = Path(root).resolve()
        self.labels = dict(labels or {})
        self.kubelet_api = KubeletApi(serving, client_ca, self._log_source)
        self.node_name = node_name
        self.capacity = dict(capacity or {})
        self.poll_interval = poll_interval
        self.heartbeat_interval = heartbeat_interval
        configuration = client.Configuration()
        config.load_kube_config(str(kubeconfig), client_configuration=configuration)
        self._api_client = client.ApiClient(configuration)
        self.api_server = configuration.host  # what its pods reach the API server at (in_cluster_env)
        self.core = client.CoreV1Api(self._api_client)
        self.leases = client.CoordinationV1Api(self._api_client)
        self.events = PodEvents(self.core, self.node_name)
        self._owns_network = network is None
        # The cluster's own loopback /16, so clusters never share pod IPs.
        self.network, self.ips = network or (lambda n: (n, IpAllocator(n.prefix)))(claim_network())
        self.bind_shim = bind_shim(self.root / "bin")
        self._containers: dict[tuple[str, str], RunningContainer] = {}
        self._frozen: dict[str, RunningContainer] = {}  # by pod uid, after ``lose``
        self._stop = threading.Event()
        self._reaped = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> PodRunner:
        self.kubelet_api.start()
        self._register_node()
        self._renew_lease()
        for target, name in ((self._loop, "pod-runner"), (self._heartbeat, "node-heartbeat")):
            self._threads.append(threading.Thread(target=target, name=f"{name}-{self.node_name}", daemon=True))
            self._threads[-1].start()
        return self

    def lose(self) -> None:
        """The node's machine dies: its pods' processes stop at once (SIGSTOP) and nothing more is posted (no pod
        status, no heartbeat); the API still shows its pods as they were, as it would for a node that lost power.

        The processes are frozen rather than killed on the spot because every local node shares the host's
        kernel: a killed process's sockets send resets to its peers at once, which a machine that lost power never
        does (its peers hang in their collectives until the cluster reacts). Each frozen process is killed when
        its pod leaves the API (force-deleted, or garbage-collected with the node) or the node is stopped or
        added again (a reboot).
        """
        def freeze() -> None:
            for running in list(self._containers.values()):
                if running.process is not None and running.process.poll() is None:
                    _signal_group(running.process, signal.SIGSTOP)

        freeze()  # at once: the kubelet's threads may take seconds to notice the stop on a busy machine
        self._stop.set()
        self.kubelet_api.stop()
        for thread in self._threads:
            thread.join(30)
        freeze()  # and whatever they started meanwhile
        self._frozen = {r.uid: r for r in self._containers.values() if r.process and r.process.poll() is None}
        self._containers.clear()
        self._reaped.clear()
        self._threads = [threading.Thread(target=self._reap, name=f"reaper-{self.node_name}", daemon=True)]
        self._threads[0].start()

    def _reap(self) -> None:
        """Kill a lost node's frozen processes as their pods leave the API."""
        while self._frozen and not self._reaped.wait(0.5):
            try:
                listed = json.loads(self.core.list_pod_for_all_namespaces(
                    field_selector=f"spec.nodeName={self.node_name}", _preload_content=False).data)["items"]
            except Exception:  # the API is going away: stop() kills them all
                continue
            present = {p["metadata"]["uid"] for p in listed}
            for uid in [u for u in self._frozen if u not in present]:
                self._kill_now(self._frozen.pop(uid))

    def _close(self) -> None:
        self.kubelet_api.stop()
        self._api_client.close()
        if self._owns_network:
            self.network.close()

    def kill(self, namespace: str, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal a running container's processes, as a node does to a crashed or OOM-killed one (for failure
        tests); the runner then reports the exit like any other."""
        running = self._containers.get((namespace, name))
        if running is None or running.process is None or running.process.poll() is not None:
            raise LookupError(f"pod {namespace}/{name} has no running container on this node")
        _signal_group(running.process, sig)

    def stop(self) -> None:
        """Stop polling and kill every process this runner started (TERM, then KILL)."""
        self._stop.set()
        self._reaped.set()
        for thread in self._threads:
            thread.join(30)
        for frozen in self._frozen.values():
            self._kill_now(frozen)
        self._frozen.clear()
        running = [c.process for c in self._containers.values() if c.process and c.process.poll() is None]
        for process in running:
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + MAX_LOCAL_GRACE_S
        for process in running:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()
        self._close()

    def __enter__(self) -> PodRunner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _register_node(self) -> None:
        capacity = node_capacity(self.capacity)
        arch = os.uname().machine.replace("x86_64", "amd64").replace("aarch64", "arm64")
        labels = {**self.labels, "kubernetes.io/hostname": self.node_name, "kubernetes.io/os": "linux",
                  "kubernetes.io/arch": arch, "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": arch}
        node = {"metadata": {"name": self.node_name, "labels": labels}, "spec": {},
                "status": {"capacity": capacity, "allocatable": capacity}}
        try:
            self.core.create_node(node)
        except ApiException as exc:
            if exc.status != 409:
                raise
        self.core.patch_node_status(self.node_name, {"status": {
            "capacity": capacity, "allocatable": capacity,
            "addresses": [{"type": "InternalIP", "address": HOST_IP}, {"type": "Hostname", "address": self.node_name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.kubelet_api.port}},
            "nodeInfo": {"machineID": self.node_name, "systemUUID": self.node_name, "bootID": "",
                         "kernelVersion": os.uname().release, "osImage": "local", "containerRuntimeVersion": "local://",
                         "kubeletVersion": "local", "kubeProxyVersion": "", "operatingSystem": "linux",
                         "architecture": arch},
            "conditions": [self._ready_condition(transition=True)]}})

    def _ready_condition(self, transition: bool) -> dict[str, Any]:
        condition = {"type": "Ready", "status": "True", "reason": "KubeletReady",
                     "message": "kubelet is posting ready status", "lastHeartbeatTime": now_rfc3339()}
        return condition | ({"lastTransitionTime": now_rfc3339()} if transition else {})

    def _renew_lease(self) -> None:
        """The node's Lease in ``kube-node-lease``: the heartbeat kube-controller-manager watches (owned by the
        Node, so it goes with it)."""
        try:
            self.leases.patch_namespaced_lease(self.node_name, "kube-node-lease",
                                               {"spec": {"renewTime": now_micro()}}, _preload_content=False)
            return
        except ApiException as exc:
            if exc.status != 404:
                raise
        node = json.loads(self.core.read_node(self.node_name, _preload_content=False).data)
        lease = {"metadata": {"name": self.node_name, "namespace": "kube-node-lease", "ownerReferences": [
                     {"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": node["metadata"]["uid"]}]},
                 "spec": {"holderIdentity": self.node_name, "leaseDurationSeconds": LEASE_DURATION_S,
                          "renewTime": now_micro()}}
        try:
            self.leases.create_namespaced_lease("kube-node-lease", lease)
        except ApiException as exc:
            if exc.status != 409:
                raise

    def _heartbeat(self) -> None:
        """Renew the Lease and post the Ready condition every ``heartbeat_interval``."""
        while not self._stop.wait(self.heartbeat_interval):
            try:
                self._renew_lease()
                node = json.loads(self.core.read_node(self.node_name, _preload_content=False).data)
                previous = next((c for c in (node.get("status") or {}).get("conditions") or []
                                 if c.get("type") == "Ready"), {})
                condition = self._ready_condition(transition=previous.get("status") != "True")
                if previous.get("status") == "True":
                    condition["lastTransitionTime"] = previous.get("lastTransitionTime") or now_rfc3339()
                self.core.patch_node_status(self.node_name, {"status": {"conditions": [condition]}},
                                            _preload_content=False)
            except ApiException as exc:
                if exc.status != 404:  # a deleted node is not registered again (as a kubelet, until restarted)
                    logger.warning("node %s: status not posted: %s", self.node_name, exc.reason)
            except Exception:  # the API may be going away at shutdown
                if self._stop.is_set():
                    break
                logger.exception("node %s: status not posted", self.node_name)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync_once()
            except Exception:  # the API may be going away at shutdown; keep the runner alive otherwise
                if self._stop.is_set():
                    break
                logger.exception("pod runner sync failed")
            self._stop.wait(self.poll_interval)

    # -- one reconciliation pass -----------------------------------------------------------------

    def sync_once(self) -> None:
        pods = json.loads(self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node_name}", _preload_content=False).data)["items"]
        pods.sort(key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]))
        seen = set()
        for pod in pods:
            key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
            seen.add(key)
            spec = pod.get("spec") or {}
            running = self._containers.get(key)
            if running is not None and running.uid != pod["metadata"]["uid"]:
                self._kill_now(self._containers.pop(key))  # a new pod with the same name: the old one is gone
                running = None
            if spec.get("nodeName") != self.node_name:
                continue
            try:
                if pod["metadata"].get("deletionTimestamp"):
                    self._terminate(pod, running)
                else:
                    self._drive(pod, running)
            except Exception:  # one pod's failed sync does not hold up the node's other pods
                if self._stop.is_set():
                    raise
                logger.exception("pod %s/%s: sync failed; retrying on the next pass", *key)
        for key in [k for k in self._containers if k not in seen]:
            self._kill_now(self._containers.pop(key))  # removed from the API without a graceful delete

    def _pod_dir(self, pod: dict[str, Any]) -> Path:
        return self.root / "pods" / pod["metadata"]["namespace"] / pod["metadata"]["name"]

    def _lookup(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        read = {"configmaps": self.core.read_namespaced_config_map, "secrets": self.core.read_namespaced_secret,
                "persistentvolumeclaims": self.core.read_namespaced_persistent_volume_claim}.get(kind)
        try:
            answer = read(name, namespace, _preload_content=False) if read else \
                self.core.read_persistent_volume(name, _preload_content=False)
            return json.loads(answer.data)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _token(self, pod: dict[str, Any], source: dict[str, Any]) -> str:
        """A service-account token bound to ``pod``, from the TokenRequest API, as the kubelet writes into the
        ``kube-api-access-*`` volume that the ServiceAccount admission plugin adds to every pod."""
        meta, spec = pod["metadata"], pod.get("spec") or {}
        request = {"spec": {"audiences": [source["audience"]] if source.get("audience") else None,
                            "expirationSeconds": source.get("expirationSeconds") or 3600,
                            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                               "uid": meta["uid"]}}}
        try:
            answer = self.core.create_namespaced_service_account_token(
                spec.get("serviceAccountName") or "default", meta["namespace"], request, _preload_content=False)
        except ApiException as exc:
            raise PodSetupError(f"service account token: {exc.reason}: {exc.body}") from None
        return json.loads(answer.data)["status"]["token"]

    def _log_source(self, namespace: str, name: str, container: str):
        """For the kubelet API: the log of a container this node runs (or ran), and whether it has finished."""
        running = self._containers.get((namespace, name))
        path = pod_log_path(self.root, namespace, name)
        if running is None:  # ended before this agent started, or not run here at all
            return (path, lambda: True) if path.exists() else None

        def finished() -> bool:
            now = self._containers.get((namespace, name))
            return now is not running or running.finished or (running.process is None and running.restart_at is None)

        return path, finished

    def _drive(self, pod: dict[str, Any], running: RunningContainer | None) -> None:
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        phase = (pod.get("status") or {}).get("phase")
        if running is None:
            if phase in ("Succeeded", "Failed"):
                return  # finished before this runner started
            running = RunningContainer(key, pod["metadata"]["uid"], None, now_rfc3339())
            self._containers[key] = running
            try:
                self._start(pod, running)
            except Exception:
                # e.g. the node authorizer has not yet seen the binding that lets this node read the pod's
                # ConfigMap (403 "no relationship found"): forget the attempt so the next pass tries again, as a
                # kubelet's pod worker retries its sync
                if running.process is None and not running.finished:
                    self._containers.pop(key, None)
                raise
            return
        if running.finished:
            return
        if running.process is None:
            if running.restart_at is not None and time.monotonic() >= running.restart_at:
                self._start(pod, running)
            return
        code = running.process.poll()
        if code is None:
            refresh_downward_api(pod, self._pod_dir(pod))  # a kubelet's pod sync: annotations changed since start
            return
        self._exited(pod, running, code)

    def _start(self, pod: dict[str, Any], running: RunningContainer) -> None:
        pod_dir = self._pod_dir(pod)
        pod_ip = self.ips.ip(IpAllocator.pod_key(pod))
        pod.setdefault("status", {}).update(podIP=pod_ip, hostIP=HOST_IP)
        container = (pod.get("spec") or {}).get("containers", [{}])[0]
        try:
            launch = container_launch(pod, pod_dir, self.root, self._lookup, self.ips, self._token,
                                      self.api_server)
        except PodSetupError as exc:
            # A kubelet keeps the pod waiting and syncs it again: the ConfigMap or claim may exist later.
            running.restart_at = time.monotonic() + SETUP_RETRY_SECONDS
            if str(exc) != running.setup_error:
                running.setup_error = str(exc)
                self._patch_status(pod, self._status(pod, running, waiting={
                    "reason": "CreateContainerConfigError", "message": str(exc)}, phase="Pending"))
                self.events.post(pod, "Failed", f"Error: {exc}", warning=True, container=container.get("name"))
            return
        running.setup_error = ""
        name = container.get("name", "")
        self.events.post(pod, "Pulled", f'Container image "{container.get("image", "")}" already present on '
                                        "machine", container=name)
        if self.bind_shim is not None:  # the pod's wildcard binds go to its own IP, as in its own namespace
            launch.env[POD_IP_ENV] = pod_ip
            launch.env["LD_PRELOAD"] = " ".join(filter(None, [str(self.bind_shim), launch.env.get("LD_PRELOAD")]))
        log_path = pod_log_path(self.root, *running.pod_key)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        running.started_at = now_rfc3339()
        with open(log_path, "ab") as log:
            try:
                running.process = subprocess.Popen(launch.argv, env=launch.env, cwd=launch.cwd, stdout=log,
                                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                   start_new_session=True)
            except (OSError, ValueError) as exc:  # ValueError: a NUL byte in an argument or variable (runc
                # refuses it too); either way the container cannot start, and the node's other pods go on
                log.write(f"local runner: cannot start {launch.argv[0]!r}: {exc}\n".encode())
                running.process = None
                self._exited(pod, running, 128, start_error=str(exc))
                return
        running.restart_at = None
        self.events.post(pod, "Created", f"Created container: {name}", container=name)
        self.events.post(pod, "Started", f"Started container {name}", container=name)
        logger.info("started pod %s/%s (pid %d, ip %s): %s", *running.pod_key, running.process.pid, pod_ip,
                    " ".join(launch.argv))
        self._patch_status(pod, self._status(pod, running, running_state={"startedAt": running.started_at},
                                             phase="Running", image=container.get("image", "")))

    def _termination_message(self, pod: dict[str, Any], code: int) -> str:
        """What a kubelet reports as the final message: the file (4 KiB at most), or with FallbackToLogsOnError
        and a failure, the log's tail."""
        path = termination_message_file(self._pod_dir(pod))
        text = path.read_text(errors="replace")[:4096] if path.exists() else ""
        path.unlink(missing_ok=True)  # a restarted container starts with an empty file
        container = (pod.get("spec") or {}).get("containers", [{}])[0]
        if not text and code != 0 and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            log = pod_log_path(self.root, pod["metadata"]["namespace"], pod["metadata"]["name"])
            lines = log.read_text(errors="replace").splitlines()[-80:] if log.exists() else []
            text = "\n".join(lines)[-2048:]
        return ContainerPathView.of_pod(self._pod_dir(pod)).text(text)  # the paths the container printed

    def _terminated(self, pod: dict[str, Any], running: RunningContainer, code: int,
                    start_error: str = "") -> dict[str, Any]:
        """The container's terminated state: exit code (128 + signal when killed), reason, message."""
        terminated: dict[str, Any] = {"startedAt": running.started_at, "finishedAt": now_rfc3339(),
                                      "containerID": f"local://{running.process.pid if running.process else 0}"}
        if code < 0:  # killed by a signal: the exit code a container runtime reports is 128 + signal
            terminated.update(exitCode=128 - code, signal=-code, reason="Error",
                              message=f"killed by signal {signal.Signals(-code).name}")
        else:
            terminated.update(exitCode=code, reason="Completed" if code == 0 else "Error")
        if start_error:
            terminated.update(reason="StartError", message=start_error)
        elif message := self._termination_message(pod, code):
            terminated["message"] = message
        return terminated

    def _exited(self, pod: dict[str, Any], running: RunningContainer, code: int, start_error: str = "") -> None:
        policy = (pod.get("spec") or {}).get("restartPolicy", "Always")
        terminated = self._terminated(pod, running, code, start_error)
        running.process = None
        restart = policy == "Always" or (policy == "OnFailure" and terminated["exitCode"] != 0)
        if restart:
            running.restart_count += 1
            running.last_terminated = terminated
            # A kubelet backs off 10 s, 20 s, ... up to 5 min; locally 0.5 s doubling up to 5 s.
            running.restart_at = time.monotonic() + min(5.0, 0.5 * 2 ** (running.restart_count - 1))
            self._patch_status(pod, self._status(pod, running, waiting={
                "reason": "CrashLoopBackOff", "message": "back-off restarting failed container"}, phase="Running"))
            container = (pod.get("spec") or {}).get("containers", [{}])[0].get("name", "")
            meta = pod["metadata"]
            self.events.post(pod, "BackOff", f"Back-off restarting failed container {container} in pod "
                                             f"{meta['name']}_{meta['namespace']}({meta.get('uid')})", warning=True,
                             container=container)
            return
        running.finished = True
        phase = "Succeeded" if terminated["exitCode"] == 0 else "Failed"
        self._patch_status(pod, self._status(pod, running, terminated=terminated, phase=phase))

    def _status(self, pod: dict[str, Any], running: RunningContainer, phase: str, image: str = "",
                running_state: dict[str, Any] | None = None, waiting: dict[str, Any] | None = None,
                terminated: dict[str, Any] | None = None) -> dict[str, Any]:
        container = (pod.get("spec") or {}).get("containers", [{}])[0]
        ready = running_state is not None
        stamp = now_rfc3339()
        state = ({"running": running_state} if running_state else {"waiting": waiting} if waiting
                 else {"terminated": terminated})
        container_status = {
            "name": container.get("name", "main"), "image": image or container.get("image", ""), "imageID": "",
            "ready": ready, "started": ready, "restartCount": running.restart_count, "state": state,
            "lastState": {"terminated": running.last_terminated} if running.last_terminated else {},
        }
        if running.process is not None:
            container_status["containerID"] = f"local://{running.process.pid}"

        def condition(kind: str, ok: bool) -> dict[str, Any]:
            return {"type": kind, "status": "True" if ok else "False", "lastTransitionTime": stamp}

        status = pod.get("status") or {}
        return {
            "phase": phase, "podIP": status.get("podIP"), "podIPs": [{"ip": status.get("podIP")}],
            "hostIP": HOST_IP, "startTime": status.get("startTime") or stamp,
            "conditions": [condition("PodScheduled", True), condition("Initialized", True),
                           condition("ContainersReady", ready), condition("Ready", ready)],
            "containerStatuses": [container_status],
        }

    def _patch_status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        meta = pod["metadata"]
        try:
            updated = self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": status},
                                                            _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return  # deleted meanwhile
            raise
        pod["status"] = json.loads(updated.data).get("status") or {}

    # -- deletion --------------------------------------------------------------------------------

    def _terminate(self, pod: dict[str, Any], running: RunningContainer | None) -> None:
        """A pod marked for deletion: SIGTERM its group, SIGKILL after the (capped) grace, then remove it.

        Its terminal status (exit code, termination message) is written first, as a kubelet writes it.
        """
        process = running.process if running else None
        if process is not None and process.poll() is None:
            if running.kill_deadline is None:
                container = (pod.get("spec") or {}).get("containers", [{}])[0].get("name", "")
                self.events.post(pod, "Killing", f"Stopping container {container}", container=container)
                grace = float(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
                running.kill_deadline = time.monotonic() + min(grace, MAX_LOCAL_GRACE_S)
                _signal_group(process, signal.SIGTERM)
            if time.monotonic() < running.kill_deadline:
                return
            _signal_group(process, signal.SIGKILL)
            process.wait()
        if process is not None and not running.finished:
            # As a kubelet does since Kubernetes 1.27: a deleted pod ends in a terminal phase, its container's exit
            # code and termination message (the checkpoint a SIGTERM'd engine saved) posted before it is removed;
            # a controller's finalizer keeps that last status readable.
            running.finished = True
            terminated = self._terminated(pod, running, process.wait())
            phase = "Succeeded" if terminated["exitCode"] == 0 else "Failed"
            self._patch_status(pod, self._status(pod, running, terminated=terminated, phase=phase))
        meta = pod["metadata"]
        self._containers.pop((meta["namespace"], meta["name"]), None)
        self.events.forget(meta.get("uid", ""))
        try:
            # With a body, kube-apiserver reads the options from it alone (a grace_period_seconds query is ignored).
            self.core.delete_namespaced_pod(meta["name"], meta["namespace"], body=client.V1DeleteOptions(
                grace_period_seconds=0, preconditions={"uid": meta["uid"]}))
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    @staticmethod
    def _kill_now(running: RunningContainer) -> None:
        if running.process is not None and running.process.poll() is None:
            _signal_group(running.process, signal.SIGKILL)
            running.process.wait()


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Signal the container's processes, as a kubelet's container runtime reaches every process of the container:
    the pod's process group and the groups of all its descendants (torchrun starts each worker in a session of its
    own, so a signal to the pod's group alone would leave the workers running, or frozen, after their pod)."""
    for group in _descendant_groups(process.pid):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            pass


def _descendant_groups(pid: int) -> list[int]:
    """``pid``'s process group first, then those of its descendants still alive, from /proc."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        children.setdefault(int(fields[1]), []).append((int(entry.name), int(fields[2])))
    groups, stack = [pid], [pid]
    while stack:
        for child, group in children.get(stack.pop(), []):
            if group not in groups:
                groups.append(group)
            stack.append(child)
    return groups
