"""``LocalCluster``: the loopback API server, the pod runner and (optionally) the operator, together.

The cluster root (default ``.local-cluster/`` in the current directory) holds the kubeconfig, pod directories
and logs, PVC directories (checkpoints, datasets), ``operator.log`` and ``api-objects.json`` (the API's objects,
saved on a clean stop). A start keeps all of it, so jobs, their status and their checkpoints survive a restart;
``fresh=True`` (``--fresh``) wipes the root first (only a root this class created, recognised by its marker file).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import yaml

from .apiserver import LocalApiServer
from .resource_client import ResourceClient
from .runner import MAX_LOCAL_GRACE_S, PodRunner, pod_log_path

MARKER = ".ascend-local-cluster"
STATE_FILE = "api-objects.json"
REPO_CRDS = Path(__file__).resolve().parents[3] / "crds"
OPERATOR_COMMAND = [sys.executable, "-m", "ascend_operator.main", "run", "--all-namespaces", "--standalone"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalCluster:
    def __init__(self, root: str | Path = ".local-cluster", crds_dir: str | Path | None = REPO_CRDS,
                 operator: bool = False, capacity: dict[str, int] | None = None, port: int = 0,
                 fresh: bool = False):
        self.root = Path(root).resolve()
        self.fresh = fresh
        self.crds_dir = Path(crds_dir) if crds_dir else None
        self.with_operator = operator
        self.capacity = capacity
        self.api_server = LocalApiServer(port=port, pod_log_file=lambda ns, name: pod_log_path(self.root, ns, name),
                                         state_file=self.root / STATE_FILE)
        self.runner: PodRunner | None = None
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
            self.runner = PodRunner(self.kubeconfig, self.root, capacity=self.capacity).start()
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

    def start_operator(self) -> subprocess.Popen[bytes]:
        """The operator as a subprocess with KUBECONFIG pointing here, logging to ``operator.log``."""
        self._operator_log = open(self.operator_log, "ab")
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig))
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
        if self.runner is not None:
            self.runner.stop()
            self.runner = None
        self.api_server.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def client(self) -> ResourceClient:
        return ResourceClient(self.kubeconfig)
