"""``LocalCluster``: the real control plane (``controlplane``), a volume provisioner, one node agent
(``PodRunner``) per node and (optionally) the operator, together.

One node named ``local`` by default; ``nodes=N`` makes ``node-1`` ... ``node-N``, each offering ``capacity``
(device counts). ``lose_node`` / ``add_node`` play a machine that dies or joins; a cordon is a plain API call
(``kubectl cordon``). A ``local up`` in another process takes the same requests from ``ascend-train local node``
through files under ``<root>/node-requests/`` (``serve_node_requests``).

The cluster root (default ``.local-cluster/`` in the current directory) holds the control plane's certificates,
etcd's data, the components' logs, the kubeconfig, pod directories and logs, volume directories (checkpoints,
datasets) and ``operator.log``. A start keeps all of it, so jobs, their status and their checkpoints survive a
restart; ``fresh=True`` (``--fresh``) wipes the root first (only a root this class created, recognised by its
marker file).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import yaml

from .controlplane import ControlPlane, write_kubeconfig
from .kueue import Kueue
from .pod_environment import IpAllocator
from .pod_network import PodNetwork, claim_network
from .processes import free_port, stop_with_parent
from .provisioner import STORAGE_CLASS, Provisioner
from .resource_client import ResourceClient
from .runner import MAX_LOCAL_GRACE_S, PodRunner
from . import topology as topology_labels

MARKER = ".ascend-local-cluster"
REPO_CRDS = Path(__file__).resolve().parents[2] / "crds"
NODE_REQUESTS = "node-requests"
OPERATOR_COMMAND = [sys.executable, "-m", "ascend_operator.main", "run", "--all-namespaces", "--standalone"]
OPERATOR_ACCOUNT = ("default", "ascend-train-operator")  # namespace and name of its ServiceAccount
OPERATOR_TOKEN_S = 365 * 24 * 3600
DEFAULT_GRACE_S = 40.0  # kube-controller-manager's default: a busy laptop must not lose nodes that are only slow


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


def install_crds(resources: ResourceClient, folder: Path) -> list[str]:
    """Apply every CustomResourceDefinition in ``folder``'s YAML files and wait until each is Established, then
    the other objects there (the admission policies that refuse locked runtime fields, which name the CRDs)."""
    names, others = [], []
    for path in sorted(folder.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                resources.apply(doc)
                names.append(doc["metadata"]["name"])
            elif doc:
                others.append(doc)
    resources.wait_established(names)
    for doc in others:
        resources.apply(doc)
    return names


class LocalCluster:
    def __init__(self, root: str | Path = ".local-cluster", crds_dir: str | Path | None = REPO_CRDS,
                 operator: bool = False, capacity: dict[str, int] | None = None, fresh: bool = False,
                 nodes: int = 1, node_grace_s: float = DEFAULT_GRACE_S, fast_storage: bool = False, say=print,
                 kueue: bool = False, topology: tuple[int, int] | None = None):
        """``capacity``: device counts each node offers; ``node_grace_s``: how long a silent node stays Ready and
        keeps its pods; ``fast_storage``: etcd without fsync (tests); ``kueue``: run Kueue's manager too
        (``ascend_cluster.kueue``), with AscendTrainJob as an external framework; ``topology``: (blocks, racks per
        block) labels on the nodes (``ascend_cluster.topology``), and Kueue's Topology with ``kueue``."""
        self.root = Path(root).resolve()
        self.fresh = fresh
        self.crds_dir = Path(crds_dir) if crds_dir else None
        self.with_operator = operator
        self.capacity = capacity
        self.node_names = ["local"] if nodes == 1 else [f"node-{i}" for i in range(1, nodes + 1)]
        self.topology = topology
        self.node_labels = topology_labels.node_labels(self.node_names, *topology) if topology else {}
        self.control_plane = ControlPlane(self.root, node_grace_s=node_grace_s, fast_storage=fast_storage, say=say)
        self.runners: dict[str, PodRunner] = {}
        self._lost: dict[str, PodRunner] = {}  # their frozen processes die with their pods
        self.provisioner: Provisioner | None = None
        self._network: tuple[PodNetwork, IpAllocator] | None = None
        self.operator: subprocess.Popen[bytes] | None = None
        self._operator_log: IO[bytes] | None = None
        self.kueue = Kueue(self.control_plane, say=say) if kueue else None

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.kubeconfig

    @property
    def kubectl(self) -> str:
        """The kubectl built at the control plane's release."""
        return self.control_plane.binary("kubectl")

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
        try:
            self.control_plane.start()
            self.install_crds()
            if self.kueue is not None:
                self.kueue.start()
            with self.client() as resources:
                resources.apply(STORAGE_CLASS)
                if self.kueue is not None and self.topology:
                    resources.apply(topology_labels.kueue_topology())
            self.provisioner = Provisioner(self.kubeconfig, self.root).start()
            network = claim_network()  # this cluster's own loopback /16, shared by its nodes
            self._network = (network, IpAllocator(network.prefix))
            for name in self.node_names:
                self.add_node(name)
            if self.with_operator:
                self.start_operator()
        except BaseException:
            self.stop()
            raise
        return self

    def install_crds(self) -> list[str]:
        """Create every CustomResourceDefinition found in ``crds_dir`` and wait until each is served."""
        if self.crds_dir is None or not self.crds_dir.is_dir():
            return []
        with self.client() as resources:
            return install_crds(resources, self.crds_dir)

    def operator_kubeconfig(self) -> Path:
        """The operator's credentials: a token of its ServiceAccount, bound (ClusterRole and, for its Lease, a Role)
        to exactly the rules its Helm chart grants (``ascend_operator.client.permissions``, which the chart is rendered
        from), so a call the chart does not allow fails with kube-apiserver's 403, as it would on a cluster."""
        from ascend_operator.client.rbac import LEADER_ELECTION_RULES, rules

        namespace, name = OPERATOR_ACCOUNT
        with self.client() as resources:
            for obj in operator_rbac(namespace, name, rules(), LEADER_ELECTION_RULES):
                resources.apply(obj)
            token = resources.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                                      {"spec": {"expirationSeconds": OPERATOR_TOKEN_S}})["status"]["token"]
        return write_kubeconfig(self.root / "operator-kubeconfig", self.control_plane.server,
                                self.control_plane.pki.ca.cert, f"system:serviceaccount:{namespace}:{name}", token,
                                namespace)

    def start_operator(self) -> subprocess.Popen[bytes]:
        """The operator as a subprocess with its ServiceAccount's kubeconfig, logging to ``operator.log``."""
        kubeconfig = self.operator_kubeconfig()
        self._operator_log = open(self.operator_log, "ab")
        env = dict(os.environ, KUBECONFIG=str(kubeconfig))
        # A free port for the operator's own metrics, so a second cluster (or a test) on this host never clashes.
        env.setdefault("ASCEND_OPERATOR_METRICS_PORT", str(free_port()))
        env.setdefault("ASCEND_OPERATOR_DASHBOARD_PORT", "0")  # `ascend-train dashboard` serves it locally
        env.setdefault("ASCEND_OPERATOR_PROGRESS_INTERVAL", "2")
        self.operator = subprocess.Popen(OPERATOR_COMMAND, env=env, stdout=self._operator_log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=stop_with_parent)
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
        if self.provisioner is not None:
            self.provisioner.stop()
            self.provisioner = None
        for runners in (self.runners, self._lost):
            for name in list(runners):
                runners.pop(name).stop()
        if self._network is not None:
            self._network[0].close()
            self._network = None
        if self.kueue is not None:
            self.kueue.stop()
        self.control_plane.stop()

    # -- nodes ----------------------------------------------------------------------------------

    @property
    def runner(self) -> PodRunner:
        """The first node's agent (the only one of a one-node cluster)."""
        return next(iter(self.runners.values()))

    def add_node(self, name: str, capacity: dict[str, int] | None = None,
                 labels: dict[str, str] | None = None) -> PodRunner:
        """Start an agent for ``name`` (a new node, or one lost before: it registers and is Ready again)."""
        if name in self.runners:
            raise ValueError(f"node {name} is already running")
        assert self._network is not None, "the cluster is not started"
        if name in self._lost:  # a reboot: what ran there before is gone
            self._lost.pop(name).stop()
        plane = self.control_plane
        self.runners[name] = PodRunner(plane.node_kubeconfig(name), self.root, name, plane.kubelet_serving(name),
                                       plane.pki.ca.cert, capacity or self.capacity, network=self._network,
                                       labels=labels if labels is not None else self.node_labels.get(name)).start()
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
