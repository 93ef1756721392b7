"""Flux's source-controller and kustomize-controller against a local cluster, and a git repository served on
loopback for them to read: the GitOps loop of docs/gitops.md, for real.

Both controllers are built from their Go modules (``controlplane/flux``, ``ascend_cluster.build.FLUX``) and run
here as processes, as Kueue's manager is: each with a kubeconfig of its own ServiceAccount in ``flux-system``,
bound as Flux's own install binds them (kustomize-controller to cluster-admin, Flux's ``cluster-reconciler``;
source-controller to its ``crd-controller`` rights), leader election off, metrics and health on free loopback
ports. Their CRDs come from the same modules (``config/crd/bases``). source-controller serves the artifacts it
makes from git on ``--storage-adv-addr`` (loopback), where kustomize-controller fetches them.

``GitServer`` is git's own smart HTTP server, ``git http-backend`` (Debian's git), run as a CGI program behind a
small HTTP server on 127.0.0.1: a ``GitRepository`` reads ``http://127.0.0.1:<port>/<repo>.git`` as it would read
any git host (go-git speaks only the smart protocol, and a GitRepository's URL is http, https or ssh).
"""
from __future__ import annotations

import http.server
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from . import build
from .controlplane import ControlPlane, write_kubeconfig
from .processes import Component, free_port
from .resource_client import ResourceClient

NAMESPACE = "flux-system"
TOKEN_S = 24 * 3600
START_TIMEOUT_S = 120.0
CONTROLLERS = ("source-controller", "kustomize-controller")
# source-controller's rights (Flux's crd-controller ClusterRole, less what it gives the other controllers).
SOURCE_RULES = [
    {"apiGroups": ["source.toolkit.fluxcd.io"], "resources": ["*"], "verbs": ["*"]},
    {"apiGroups": [""], "resources": ["secrets", "configmaps", "serviceaccounts"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]},
]


def module_dir(module: str) -> Path:
    """A Flux controller's module source at the pinned version."""
    return build.FLUX.source_dir(module, "Flux's CRDs come from its Go modules")


def crds() -> list[dict[str, Any]]:
    """GitRepository (and source-controller's other kinds) and Kustomization, from the controllers' modules."""
    found = []
    for name in CONTROLLERS:
        for path in sorted((module_dir(f"github.com/fluxcd/{name}") / "config" / "crd" / "bases").glob("*.yaml")):
            found += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return found


class Flux:
    """source-controller and kustomize-controller for ``control_plane``, state and logs under ``root``."""

    def __init__(self, control_plane: ControlPlane, root: Path, say=print):
        self.control_plane = control_plane
        self.root = Path(root)
        self.say = say
        self.components: dict[str, Component] = {}
        self.ports: dict[str, int] = {}

    def log(self, name: str) -> Path:
        return self.root / f"{name}.log"

    def _install(self, resources: ResourceClient) -> dict[str, str]:
        """CRDs (waited for), the namespace, the ServiceAccounts and their rights; a token for each."""
        names = []
        for crd in crds():
            resources.apply(crd)
            names.append(crd["metadata"]["name"])
        resources.wait_established(names)
        resources.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        rbac = "rbac.authorization.k8s.io/v1"
        objects: list[dict[str, Any]] = [
            {"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": "flux-source-controller"},
             "rules": SOURCE_RULES}]
        for name, role in (("source-controller", "flux-source-controller"), ("kustomize-controller", "cluster-admin")):
            objects += [
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": NAMESPACE}},
                {"apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": {"name": f"flux-{name}"},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                 "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]}]
        for obj in objects:
            resources.apply(obj)
        return {name: resources.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{name}/token",
                                        {"spec": {"expirationSeconds": TOKEN_S}})["status"]["token"]
                for name in CONTROLLERS}

    def _argv(self, name: str, binary: Path) -> list[str]:
        common = [f"--metrics-addr=127.0.0.1:{self.ports[name + '-metrics']}",
                  f"--health-addr=127.0.0.1:{self.ports[name + '-health']}",
                  "--enable-leader-election=false", "--watch-all-namespaces=true", "--log-level=info",
                  "--log-encoding=console"]
        if name == "source-controller":
            storage = self.ports["storage"]
            return [str(binary), *common, f"--storage-path={self.root / 'storage'}",
                    f"--storage-addr=127.0.0.1:{storage}", f"--storage-adv-addr=127.0.0.1:{storage}"]
        return [str(binary), *common]

    def start(self) -> Flux:
        folder = build.binaries(build.FLUX, say=self.say)
        started = time.monotonic()
        (self.root / "storage").mkdir(parents=True, exist_ok=True)  # source-controller's artifacts
        for name in CONTROLLERS:
            self.ports[f"{name}-metrics"], self.ports[f"{name}-health"] = free_port(), free_port()
        self.ports["storage"] = free_port()
        with ResourceClient(self.control_plane.kubeconfig) as resources:
            tokens = self._install(resources)
        try:
            for name in CONTROLLERS:
                kubeconfig = write_kubeconfig(self.root / f"{name}.kubeconfig", self.control_plane.server,
                                              self.control_plane.pki.ca.cert,
                                              f"system:serviceaccount:{NAMESPACE}:{name}", tokens[name], NAMESPACE)
                env = dict(os.environ, KUBECONFIG=str(kubeconfig), RUNTIME_NAMESPACE=NAMESPACE)
                self.components[name] = Component(name, self._argv(name, folder / name), self.log(name),
                                                  env=env).start()
            for name in CONTROLLERS:
                self._wait_healthy(name)
        except BaseException:
            self.stop()
            raise
        self.say(f"flux up in {time.monotonic() - started:.1f} s (source-controller and kustomize-controller "
                 f"{build.FLUX.required_version('github.com/fluxcd/kustomize-controller')})", flush=True)
        return self

    def _wait_healthy(self, name: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        last = ""
        while True:
            if not self.components[name].alive():
                raise RuntimeError(self.components[name].died_because())
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[name + '-health']}/readyz",
                                            timeout=5) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} not ready after {START_TIMEOUT_S:.0f} s ({last}); see {self.log(name)}")
            time.sleep(0.2)

    def stop(self) -> None:
        for name in list(self.components):
            self.components.pop(name).stop()

    def __enter__(self) -> Flux:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class _GitHandler(http.server.BaseHTTPRequestHandler):
    """One request through ``git http-backend`` (CGI/1.1: the request in the environment and on stdin, headers
    then the body on stdout)."""

    root: Path
    backend: str

    def _cgi(self) -> None:
        path, _, query = self.path.partition("?")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        env = {"GIT_PROJECT_ROOT": str(self.root), "GIT_HTTP_EXPORT_ALL": "1", "PATH_INFO": path,
               "QUERY_STRING": query, "REQUEST_METHOD": self.command, "CONTENT_TYPE": self.headers.get(
                   "Content-Type", ""), "CONTENT_LENGTH": str(length), "REMOTE_ADDR": self.client_address[0],
               "GATEWAY_INTERFACE": "CGI/1.1", "SERVER_PROTOCOL": "HTTP/1.1", "PATH": os.environ.get("PATH", ""),
               "HTTP_GIT_PROTOCOL": self.headers.get("Git-Protocol", "")}
        if self.headers.get("Content-Encoding"):
            env["HTTP_CONTENT_ENCODING"] = self.headers["Content-Encoding"]
        done = subprocess.run([self.backend], input=body, env=env, capture_output=True, timeout=60)
        head, _, payload = done.stdout.partition(b"\r\n\r\n")
        if not _:
            head, _, payload = done.stdout.partition(b"\n\n")
        headers = [line.split(":", 1) for line in head.decode("latin-1").splitlines() if ":" in line]
        status = next((v.strip() for k, v in headers if k.lower() == "status"), "200 OK")
        self.send_response(int(status.split()[0]), status.partition(" ")[2] or None)
        for key, value in headers:
            if key.lower() != "status":
                self.send_header(key, value.strip())
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _cgi

    def log_message(self, *args: Any) -> None:
        pass


class GitServer:
    """Bare repositories under ``root`` served read-only over git's smart HTTP on 127.0.0.1 (``url(name)``)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        backend = Path(subprocess.run(["git", "--exec-path"], capture_output=True, text=True,
                                      check=True).stdout.strip()) / "git-http-backend"
        if not backend.exists():
            raise RuntimeError(f"{backend} is missing: git's smart HTTP server comes with Debian's git package")
        handler = type("Handler", (_GitHandler,), {"root": self.root, "backend": str(backend)})
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="git-http", daemon=True)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{name}.git"

    def start(self) -> GitServer:
        self.root.mkdir(parents=True, exist_ok=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> GitServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
