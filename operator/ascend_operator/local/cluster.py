"""``LocalCluster``: the loopback API server, the scheduler, the node controllers, one kubelet (``PodRunner``)
per node and (optionally) the operator, together.

One node named ``local`` by default; ``nodes=N`` makes ``node-1`` ... ``node-N``, each offering ``capacity``
(device counts). ``lose_node`` / ``add_node`` play a machine that dies or joins; a cordon is a plain API call
(``kubectl cordon``). A ``local up`` in another process takes the same requests from ``ascend-train local node``
through files under ``<root>/node-requests/`` (``serve_node_requests``).

The cluster root (default ``.local-cluster/`` in the current directory) holds the kubeconfig, pod directories
and logs, PVC directories (checkpoints, datasets), ``operator.log`` and ``api-objects.json`` (the API's objects,
saved on a clean stop). A start keeps all of it, so jobs, their status and their checkpoints survive a restart;
``fresh=True`` (``--fresh``) wipes the root first (only a root this class created, recognised by its marker file).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import yaml

from . import authorization
from .apiserver import LocalApiServer
from .resource_client import ResourceClient
from .node_lifecycle import DEFAULT_GRACE_S, NodeLifecycle
from .pod_environment import IpAllocator
from .pod_network import PodNetwork, claim_network
from .runner import MAX_LOCAL_GRACE_S, PodRunner, pod_log_path
from .scheduler import Scheduler

MARKER = ".ascend-local-cluster"
STATE_FILE = "api-objects.json"
REPO_CRDS = Path(__file__).resolve().parents[3] / "crds"
NODE_REQUESTS = "node-requests"
OPERATOR_COMMAND = [sys.executable, "-m", "ascend_operator.main", "run", "--all-namespaces", "--standalone"]


OPERATOR_ACCOUNT = ("default", "ascend-train-operator")  # namespace and name of its ServiceAccount


def operator_rbac(namespace: str, name: str, cluster_rules: list[dict[str, Any]],
                  lease_rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ServiceAccount, ClusterRole, Role and bindings a cluster-wide install of the chart makes."""
    account = {"kind": "ServiceAccount", "name": name, "namespace": namespace}
    rbac = "rbac.authorization.k8s.io/v1"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}},
        {"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": name}, "rules": cluster_rules},
        {"apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": {"name": name}, "subjects": [account],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}},
        {"apiVersion": rbac, "kind": "Role", "metadata": {"name": f"{name}-leader-election", "namespace": namespace},
         "rules": lease_rules},
        {"apiVersion": rbac, "kind": "RoleBinding", "metadata": {"name": f"{name}-leader-election",
                                                                 "namespace": namespace}, "subjects": [account],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{name}-leader-election"}},
    ]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalCluster:
    def __init__(self, root: str | Path = ".local-cluster", crds_dir: str | Path | None = REPO_CRDS,
                 operator: bool = False, capacity: dict[str, int] | None = None, port: int = 0,
                 fresh: bool = False, nodes: int = 1, node_grace_s: float = DEFAULT_GRACE_S):
        """``capacity``: device counts each node offers; ``node_grace_s``: how long a silent node stays Ready."""
        self.root = Path(root).resolve()
        self.fresh = fresh
        self.crds_dir = Path(crds_dir) if crds_dir else None
        self.with_operator = operator
        self.capacity = capacity
        self.node_names = ["local"] if nodes == 1 else [f"node-{i}" for i in range(1, nodes + 1)]
        self.node_grace_s = node_grace_s
        self.api_server = LocalApiServer(port=port, pod_log_file=lambda ns, name: pod_log_path(self.root, ns, name),
                                         state_file=self.root / STATE_FILE)
        self.runners: dict[str, PodRunner] = {}
        self._lost: dict[str, PodRunner] = {}  # their frozen processes die with their pods
        self.scheduler: Scheduler | None = None
        self.node_lifecycle: NodeLifecycle | None = None
        self._network: tuple[PodNetwork, IpAllocator] | None = None
        self.operator: subprocess.Popen[bytes] | None = None
        self._operator_log: IO[bytes] | None = None

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def operator_log(self) -> Path:
        return self.root / "operator.log"

    def _prepare_root(self) -> None:
        if self.root.exists() and any(self.root.iterdir()):
            if not (self.root / MARKER).exists():
                raise RuntimeError(f"{self.root} is not empty and was not made by a local cluster; "
                                   "choose another --root")
            if self.fresh:
                shutil.rmtree(self.root)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / MARKER).write_text("created by ascend-train local; kept across restarts, wiped by --fresh\n")

    def start(self) -> LocalCluster:
        self._prepare_root()
        self.api_server.start()
        try:
            self.api_server.write_kubeconfig(self.kubeconfig)
            self.install_crds()
            network = claim_network()  # this cluster's own loopback /16, shared by its nodes
            self._network = (network, IpAllocator(network.prefix))
            self.scheduler = Scheduler(self.kubeconfig).start()
            for name in self.node_names:
                self.add_node(name)
            self.node_lifecycle = NodeLifecycle(self.kubeconfig, self.node_grace_s).start()
            if self.with_operator:
                self.start_operator()
        except BaseException:
            self.stop()
            raise
        return self

    def install_crds(self) -> list[str]:
        """Create every CustomResourceDefinition found in ``crds_dir``; returns their names."""
        if self.crds_dir is None or not self.crds_dir.is_dir():
            return []
        names = []
        resources = ResourceClient(self.kubeconfig)
        try:
            for path in sorted(self.crds_dir.glob("*.yaml")):
                for doc in yaml.safe_load_all(path.read_text()):
                    if doc and doc.get("kind") == "CustomResourceDefinition":
                        resources.apply(doc)
                        names.append(doc["metadata"]["name"])
        finally:
            resources.close()
        return names

    def operator_kubeconfig(self) -> Path:
        """The operator's credentials: a token of its ServiceAccount, bound (ClusterRole and, for its Lease, a Role)
        to exactly the rules its Helm chart grants (``ascend_operator.permissions``, which the chart is rendered
        from), so a call the chart does not allow fails here with kube-apiserver's 403, as it would on a cluster."""
        from ..permissions import LEADER_ELECTION_RULES, rules

        namespace, name = OPERATOR_ACCOUNT
        resources = ResourceClient(self.kubeconfig)
        try:
            for obj in operator_rbac(namespace, name, rules(), LEADER_ELECTION_RULES):
                resources.apply(obj)
        finally:
            resources.close()
        token = self.api_server.issue_token(authorization.service_account(namespace, name))
        return self.api_server.write_kubeconfig(self.root / "operator-kubeconfig", namespace, token)

    def start_operator(self) -> subprocess.Popen[bytes]:
        """The operator as a subprocess with its ServiceAccount's kubeconfig, logging to ``operator.log``."""
        kubeconfig = self.operator_kubeconfig()
        self._operator_log = open(self.operator_log, "ab")
        env = dict(os.environ, KUBECONFIG=str(kubeconfig))
        # A free port for the operator's own metrics, so a second cluster (or a test) on this host never clashes.
        env.setdefault("ASCEND_OPERATOR_METRICS_PORT", str(_free_port()))
        env.setdefault("ASCEND_OPERATOR_DASHBOARD_PORT", "0")  # `ascend-train dashboard` serves it locally
        env.setdefault("ASCEND_OPERATOR_PROGRESS_INTERVAL", "2")
        self.operator = subprocess.Popen(OPERATOR_COMMAND, env=env, stdout=self._operator_log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        return self.operator

    def stop(self) -> None:
        if self.operator is not None and self.operator.poll() is None:
            os.killpg(self.operator.pid, signal.SIGTERM)
            try:
                self.operator.wait(MAX_LOCAL_GRACE_S * 3)
            except subprocess.TimeoutExpired:
                os.killpg(self.operator.pid, signal.SIGKILL)
                self.operator.wait()
        if self._operator_log is not None:
            self._operator_log.close()
            self._operator_log = None
        for part in (self.node_lifecycle, self.scheduler):  # first, so that stopped kubelets evict nothing
            if part is not None:
                part.stop()
        self.scheduler = self.node_lifecycle = None
        for runners in (self.runners, self._lost):
            for name in list(runners):
                runners.pop(name).stop()
        if self._network is not None:
            self._network[0].close()
            self._network = None
        self.api_server.stop()

    # -- nodes ----------------------------------------------------------------------------------

    @property
    def runner(self) -> PodRunner:
        """The first node's kubelet (the only one of a one-node cluster)."""
        return next(iter(self.runners.values()))

    def add_node(self, name: str, capacity: dict[str, int] | None = None) -> PodRunner:
        """Start a kubelet for ``name`` (a new node, or one lost before: it registers and is Ready again)."""
        if name in self.runners:
            raise ValueError(f"node {name} is already running")
        assert self._network is not None, "the cluster is not started"
        if name in self._lost:  # a reboot: what ran there before is gone
            self._lost.pop(name).stop()
        self.runners[name] = PodRunner(self.kubeconfig, self.root, name, capacity or self.capacity,
                                       network=self._network).start()
        return self.runners[name]

    def lose_node(self, name: str) -> None:
        """The machine ``name`` dies: its pods' processes stop (and are killed once their pods are gone) and its
        kubelet goes silent; the node lifecycle controller marks it Unknown after ``node_grace_s`` and taint
        eviction ends its pods."""
        if name not in self.runners:
            raise ValueError(f"no running node {name} (running: {', '.join(self.runners) or 'none'})")
        self._lost[name] = self.runners.pop(name)
        self._lost[name].lose()

    def kill_pod(self, namespace: str, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal a pod's container on whichever node runs it (as ``PodRunner.kill``)."""
        for runner in self.runners.values():
            try:
                return runner.kill(namespace, name, sig)
            except LookupError:
                continue
        raise LookupError(f"pod {namespace}/{name} has no running container on any node")

    def serve_node_requests(self) -> None:
        """Carry out the requests ``ascend-train local node`` left under ``<root>/node-requests/``: each
        ``<id>.json`` (``{"action": "lose"|"add", "node": NAME}``) gets ``<id>.done`` with "ok" or the error."""
        folder = self.root / NODE_REQUESTS
        for request in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                asked = json.loads(request.read_text())
                {"lose": self.lose_node, "add": self.add_node}[asked["action"]](asked["node"])
                answer = "ok"
            except (ValueError, KeyError) as exc:
                answer = f"{exc}"
            request.with_suffix(".done").write_text(answer)
            request.unlink()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def client(self) -> ResourceClient:
        return ResourceClient(self.kubeconfig)
