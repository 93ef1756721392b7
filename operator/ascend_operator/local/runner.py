"""``PodRunner``: an emulated kubelet (and scheduler) for one local node.

It polls the API for pods, binds the ones its node can take, starts each pod's first container as a local
process group (see ``pod_environment`` for env, volumes and the path/DNS rewrites), and reports status the way
a kubelet does: Pending -> Running -> Succeeded/Failed, with restartPolicy honoured.

Differs from a kubelet: no images (the host's Python environment is the image), no init or sidecar containers
(only the first container runs), no probes, no cgroup limits (CPU and memory requests are not accounted;
only extended resources such as ``huawei.com/Ascend910`` are, against the node's configured capacity), and
nodeSelector, affinity and tolerations are ignored (there is one node).
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

from .node_events import SCHEDULER, PodEvents
from .pod_environment import (IpAllocator, PodSetupError, container_launch, refresh_downward_api,
                              termination_message_file)
from .pod_network import POD_IP_ENV, bind_shim, claim_network

logger = logging.getLogger(__name__)

STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage", "pods")
MAX_LOCAL_GRACE_S = 3.0  # terminationGracePeriodSeconds is capped locally so that stopping stays quick
HOST_IP = "127.0.0.1"


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_log_path(root: Path, namespace: str, name: str) -> Path:
    return Path(root) / "pods" / namespace / name / "container.log"


def read_logs(root: Path, namespace: str, name: str) -> str:
    """The pod's container output (stdout and stderr, all restarts), as ``kubectl logs`` would show it."""
    path = pod_log_path(root, namespace, name)
    return path.read_text(errors="replace") if path.exists() else ""


def extended_requests(pod: dict[str, Any]) -> dict[str, int]:
    """Extended resources (``vendor/name``) the pod's containers ask for; requests default to limits."""
    total: dict[str, int] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, amount in asked.items():
            if name in STANDARD_RESOURCES or name.startswith("hugepages-") or "/" not in name:
                continue
            total[name] = total.get(name, 0) + int(str(amount))
    return total


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


class PodRunner:
    """Runs pods bound to ``node_name`` as local processes under ``root/pods/<ns>/<pod>/``."""

    def __init__(self, kubeconfig: str | Path, root: str | Path, node_name: str = "local",
                 capacity: dict[str, int] | None = None, poll_interval: float = 0.2):
        self.root = Path(root).resolve()
        self.node_name = node_name
        self.capacity = dict(capacity or {})
        self.poll_interval = poll_interval
        configuration = client.Configuration()
        config.load_kube_config(str(kubeconfig), client_configuration=configuration)
        self._api_client = client.ApiClient(configuration)
        self.core = client.CoreV1Api(self._api_client)
        self.events = PodEvents(self.core, self.node_name)
        self.network = claim_network()  # this cluster's own loopback /16, so clusters never share pod IPs
        self.ips = IpAllocator(self.network.prefix)
        self.bind_shim = bind_shim(self.root / "bin")
        self._containers: dict[tuple[str, str], RunningContainer] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> PodRunner:
        self._register_node()
        self._thread = threading.Thread(target=self._loop, name="pod-runner", daemon=True)
        self._thread.start()
        return self

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
        if self._thread is not None:
            self._thread.join(30)
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
        self._api_client.close()
        self.network.close()

    def __enter__(self) -> PodRunner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _register_node(self) -> None:
        capacity = {"cpu": str(os.cpu_count() or 1), "pods": "110", **{k: str(v) for k, v in self.capacity.items()}}
        node = {"metadata": {"name": self.node_name, "labels": {"kubernetes.io/hostname": self.node_name}},
                "status": {"capacity": capacity, "allocatable": capacity}}
        try:
            self.core.create_node(node)
        except ApiException as exc:
            if exc.status != 409:
                raise
        self.core.patch_node_status(self.node_name, {"status": {
            "capacity": capacity, "allocatable": capacity,
            "addresses": [{"type": "InternalIP", "address": HOST_IP}, {"type": "Hostname", "address": self.node_name}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "local pod runner is posting ready status",
                            "lastHeartbeatTime": now_rfc3339(), "lastTransitionTime": now_rfc3339()}]}})

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
        pods = json.loads(self.core.list_pod_for_all_namespaces(_preload_content=False).data)["items"]
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
            if pod["metadata"].get("deletionTimestamp"):
                self._terminate(pod, running)
            elif not spec.get("nodeName"):
                self._schedule(pod, pods)
            elif spec["nodeName"] == self.node_name:
                self._drive(pod, running)
        for key in [k for k in self._containers if k not in seen]:
            self._kill_now(self._containers.pop(key))  # removed from the API without a graceful delete

    def _schedule(self, pod: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        used: dict[str, int] = {}
        for other in pods:
            if (other.get("spec") or {}).get("nodeName") == self.node_name and \
                    (other.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                for name, amount in extended_requests(other).items():
                    used[name] = used.get(name, 0) + amount
        short = sorted(name for name, amount in extended_requests(pod).items()
                       if used.get(name, 0) + amount > self.capacity.get(name, 0))
        meta = pod["metadata"]
        if short:
            reasons = ", ".join(f"1 Insufficient {name}" for name in short)
            message = f"0/1 nodes are available: {reasons}."
            condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
            current = next((c for c in (pod.get("status") or {}).get("conditions") or []
                            if c.get("type") == "PodScheduled"), None)
            if current is None or current.get("message") != message:
                condition["lastTransitionTime"] = now_rfc3339()
                self._patch_status(pod, {"phase": "Pending", "conditions": [condition]})
                self.events.post(pod, "FailedScheduling", message, SCHEDULER, warning=True)
            return
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": meta["name"]},
                "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name}}
        try:
            self.core.create_namespaced_pod_binding(meta["name"], meta["namespace"], body, _preload_content=False)
        except ApiException as exc:
            if exc.status not in (404, 409):  # deleted or bound meanwhile
                raise
            return
        self.events.post(pod, "Scheduled", f"Successfully assigned {meta['namespace']}/{meta['name']} to "
                                           f"{self.node_name}", SCHEDULER)

    def _pod_dir(self, pod: dict[str, Any]) -> Path:
        return self.root / "pods" / pod["metadata"]["namespace"] / pod["metadata"]["name"]

    def _lookup(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        read = self.core.read_namespaced_config_map if kind == "configmaps" else self.core.read_namespaced_secret
        try:
            return json.loads(read(name, namespace, _preload_content=False).data)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _drive(self, pod: dict[str, Any], running: RunningContainer | None) -> None:
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        phase = (pod.get("status") or {}).get("phase")
        if running is None:
            if phase in ("Succeeded", "Failed"):
                return  # finished before this runner started
            running = RunningContainer(key, pod["metadata"]["uid"], None, now_rfc3339())
            self._containers[key] = running
            self._start(pod, running)
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
            launch = container_launch(pod, pod_dir, self.root, self._lookup, self.ips)
        except PodSetupError as exc:
            running.finished = True
            self._patch_status(pod, self._status(pod, running, waiting={
                "reason": "CreateContainerConfigError", "message": str(exc)}, phase="Pending"))
            self.events.post(pod, "Failed", f"Error: {exc}", warning=True, container=container.get("name"))
            return
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
            except OSError as exc:
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
        return text

    def _exited(self, pod: dict[str, Any], running: RunningContainer, code: int, start_error: str = "") -> None:
        policy = (pod.get("spec") or {}).get("restartPolicy", "Always")
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

        No more status is written for it.
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
        meta = pod["metadata"]
        self._containers.pop((meta["namespace"], meta["name"]), None)
        self.events.forget(meta.get("uid", ""))
        try:
            self.core.delete_namespaced_pod(meta["name"], meta["namespace"], grace_period_seconds=0,
                                            body=client.V1DeleteOptions(preconditions={"uid": meta["uid"]}))
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    @staticmethod
    def _kill_now(running: RunningContainer) -> None:
        if running.process is not None and running.process.poll() is None:
            _signal_group(running.process, signal.SIGKILL)
            running.process.wait()


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
