"""``ControlPlane``: etcd, kube-apiserver, kube-controller-manager and kube-scheduler, built from their own Go
modules (``build``), started on free loopback ports with the flags envtest and kwok use, and stopped cleanly.

Everything lives under ``root``: ``pki/`` (the CA, serving and client certificates, the service-account key:
``certificates``), ``etcd/`` (the data: a restart keeps every object), ``logs/<component>.log`` and the
kubeconfigs (``kubeconfig`` is the admin's). ``fast_storage`` runs etcd with ``--unsafe-no-fsync`` (tests: what
a crash of the machine could lose does not matter there). ``node_grace_s`` is kube-controller-manager's
``--node-monitor-grace-period`` and the default tolerations' seconds for unreachable and not-ready nodes (the
DefaultTolerationSeconds admission plugin's flags): how long a silent node keeps its pods. ``audit_policy``, an
audit ``Policy`` (``audit.k8s.io/v1``) as a dict, turns kube-apiserver's audit log on: the policy is written to
``audit-policy.yaml`` and the events, one JSON object a line, to ``logs/audit.log`` (``audit_log``) in blocking
mode, so an event is in the file before its request is answered (a reader can count requests as they happen).

Controllers that cannot work on one host are switched off, and nothing else: the endpoint controllers (pod IPs are
loopback addresses, which Endpoints and EndpointSlices refuse), and the cloud and IPAM ones. kube-scheduler's gang
scheduling is on (``WORKLOAD_SCHEDULING``: its feature gates in every component, its API in kube-apiserver).
"""
from __future__ import annotations

import functools
import json
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from . import build
from .certificates import Authority, KeyPair
from .processes import Component, free_port

SERVICE_CIDR = "10.96.0.0/16"
ISSUER = "https://kubernetes.default.svc.cluster.local"
DISABLED_CONTROLLERS = ("endpoints-controller", "endpointslice-controller", "endpointslice-mirroring-controller",
                        "service-lb-controller", "node-ipam-controller", "cloud-node-lifecycle-controller",
                        "node-route-controller")
START_TIMEOUT_S = 120.0
# kube-scheduler's gang scheduling and topology-aware placement of pod groups (KEP-4671; the operator's
# gangScheduling: kubernetes), by release: the feature gates turned on in every component and the API version of
# scheduling.k8s.io served. 1.36 made PodGroup the runtime object (v1alpha2) and schedules a group's pods in one
# cycle; 1.37 serves v1alpha3 (GangScheduling folded into GenericWorkload, beta but off by default). 1.35's
# Workload API (v1alpha1: pods name a Workload, whose gang plugin held each pod at Permit, so two gangs could
# each hold part of the nodes until a 5-minute timeout) is not used.
WORKLOAD_SCHEDULING = {
    "1.36": ("GenericWorkload=true,GangScheduling=true,TopologyAwareWorkloadScheduling=true",
             "scheduling.k8s.io/v1alpha2"),
    "1.37": ("GenericWorkload=true,TopologyAwareWorkloadScheduling=true", "scheduling.k8s.io/v1alpha3"),
}


def workload_scheduling() -> tuple[list[str], list[str]]:
    """(flags for every component, flags for kube-apiserver only) that turn gang scheduling on for the pinned
    release."""
    release = ".".join(build.KUBERNETES.required_version("k8s.io/kubernetes").lstrip("v").split(".")[:2])
    if release not in WORKLOAD_SCHEDULING:
        return [], []
    gates, api = WORKLOAD_SCHEDULING[release]
    return [f"--feature-gates={gates}"], [f"--runtime-config={api}=true"]


class ControlPlaneError(RuntimeError):
    """A component did not start; the message carries the end of its log."""


def write_kubeconfig(path: Path, server: str, ca: Path, user: str, credentials: KeyPair | str,
                     namespace: str = "default") -> Path:
    """A kubeconfig for ``server`` as ``user``: a client certificate, or a bearer token (a string)."""
    auth = ({"token": credentials} if isinstance(credentials, str)
            else {"client-certificate": str(credentials.cert), "client-key": str(credentials.key)})
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "local",
              "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}],
              "users": [{"name": user, "user": auth}],
              "contexts": [{"name": "local", "context": {"cluster": "local", "user": user, "namespace": namespace}}]}
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


class ControlPlane:
    def __init__(self, root: str | Path, node_grace_s: float = 40.0, fast_storage: bool = False, say=print,
                 audit_policy: dict[str, Any] | None = None, profiling: bool = False):
        self.root = Path(root).resolve()
        self.node_grace_s = node_grace_s
        self.fast_storage = fast_storage
        self.audit_policy = audit_policy
        self.profiling = profiling  # kube-apiserver's /debug/pprof, for benchmarks/operator_scale.py
        self.say = say
        self.bin = Path()
        self.port = 0
        self.components: list[Component] = []

    @functools.cached_property
    def pki(self) -> Authority:
        """The cluster's CA and certificates, made on first use (``start``) and kept under ``root/pki``."""
        return Authority(self.root / "pki")

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def audit_log(self) -> Path:
        """kube-apiserver's audit events (written only with an ``audit_policy``)."""
        return self.root / "logs" / "audit.log"

    def binary(self, name: str) -> str:
        return str(self.bin / name)

    # -- start and stop --------------------------------------------------------------------------

    def start(self) -> ControlPlane:
        self.root.mkdir(parents=True, exist_ok=True)
        self.bin = build.binaries(build.KUBERNETES, say=self.say)
        started = time.monotonic()
        try:
            etcd_url = self._start_etcd()
            self._start_apiserver(etcd_url)
            self._wait_ok(self.components[-1], f"{self.server}/readyz", self._admin_tls())
            self.write_admin_kubeconfig()
            kcm_port, scheduler_port = self._start_controllers()
            self._wait_ok(self.components[-2], f"https://127.0.0.1:{kcm_port}/healthz", _insecure_tls())
            self._wait_ok(self.components[-1], f"https://127.0.0.1:{scheduler_port}/healthz", _insecure_tls())
            self._wait_for_default_account()
        except BaseException:
            self.stop()
            raise
        self.say(f"control plane up in {time.monotonic() - started:.1f} s: {self.server} "
                 f"(kube-apiserver {build.KUBERNETES.required_version('k8s.io/kubernetes')})", flush=True)
        return self

    def stop(self) -> None:
        for component in reversed(self.components):
            component.stop()
        self.components.clear()

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _run(self, name: str, argv: list[str]) -> Component:
        component = Component(name, argv, self.root / "logs" / f"{name}.log").start()
        self.components.append(component)
        return component

    def _start_etcd(self) -> str:
        ports_file = self.root / "etcd-peer-port"  # the member's peer URL is kept in its data: keep the port too
        peer = int(ports_file.read_text()) if ports_file.exists() else free_port()
        ports_file.write_text(str(peer))
        client = f"http://127.0.0.1:{free_port()}"
        peer_url = f"http://127.0.0.1:{peer}"
        argv = [self.binary("etcd"), "--name", "local", "--data-dir", str(self.root / "etcd"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                "--initial-cluster", f"local={peer_url}", "--log-level", "warn"]
        if self.fast_storage:
            argv.append("--unsafe-no-fsync")
        self._run("etcd", argv)
        return client

    def _start_apiserver(self, etcd_url: str) -> None:
        self.port = free_port()
        serving = self.pki.issue("apiserver", "kube-apiserver", server_names=(
            "127.0.0.1", "localhost", "10.96.0.1", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local"), client=False)
        kubelet_client = self.pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                                        ("system:masters",))
        accounts = self.pki.signing_key()
        grace = str(max(1, round(self.node_grace_s)))
        audit: list[str] = []
        if self.audit_policy is not None:
            policy = self.root / "audit-policy.yaml"
            policy.write_text(yaml.safe_dump(self.audit_policy, sort_keys=False))
            audit = [f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}",
                     "--audit-log-mode=blocking"]
        self._run("kube-apiserver", [
            self.binary("kube-apiserver"), f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
            f"--tls-cert-file={serving.cert}", f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={self.pki.ca.cert}", f"--cert-dir={self.root / 'apiserver'}",
            f"--service-account-issuer={ISSUER}", f"--service-account-key-file={accounts.cert}",
            f"--service-account-signing-key-file={accounts.key}", f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true", f"--profiling={str(self.profiling).lower()}",
            f"--kubelet-client-certificate={kubelet_client.cert}", f"--kubelet-client-key={kubelet_client.key}",
            f"--kubelet-certificate-authority={self.pki.ca.cert}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--default-not-ready-toleration-seconds={grace}", f"--default-unreachable-toleration-seconds={grace}",
            *audit, *sum(workload_scheduling(), []),
        ])

    def _component_kubeconfig(self, name: str, user: str) -> Path:
        pair = self.pki.issue(name, user)
        return write_kubeconfig(self.root / f"{name}.kubeconfig", self.server, self.pki.ca.cert, user, pair)

    def _start_controllers(self) -> tuple[int, int]:
        kcm_config = self._component_kubeconfig("controller-manager", "system:kube-controller-manager")
        scheduler_config = self._component_kubeconfig("scheduler", "system:kube-scheduler")
        kcm_port, scheduler_port = free_port(), free_port()
        disabled = ",".join(f"-{c}" for c in DISABLED_CONTROLLERS)
        self._run("kube-controller-manager", [
            self.binary("kube-controller-manager"), *_delegated(kcm_config), f"--secure-port={kcm_port}",
            f"--controllers=*,{disabled}", "--use-service-account-credentials=true",
            f"--service-account-private-key-file={self.pki.signing_key().key}",
            f"--root-ca-file={self.pki.ca.cert}",
            f"--cluster-signing-cert-file={self.pki.ca.cert}", f"--cluster-signing-key-file={self.pki.ca.key}",
            "--node-monitor-period=1s", f"--node-monitor-grace-period={max(2, round(self.node_grace_s))}s",
            *workload_scheduling()[0],
        ])
        self._run("kube-scheduler", [self.binary("kube-scheduler"), *_delegated(scheduler_config),
                                     f"--secure-port={scheduler_port}", *workload_scheduling()[0]])
        return kcm_port, scheduler_port

    # -- readiness and credentials ---------------------------------------------------------------

    def _admin_tls(self) -> ssl.SSLContext:
        admin = self.pki.issue("admin", "kubernetes-admin", ("system:masters",))
        context = ssl.create_default_context(cafile=str(self.pki.ca.cert))
        context.load_cert_chain(str(admin.cert), str(admin.key))
        return context

    def write_admin_kubeconfig(self) -> Path:
        admin = self.pki.issue("admin", "kubernetes-admin", ("system:masters",))
        return write_kubeconfig(self.kubeconfig, self.server, self.pki.ca.cert, "kubernetes-admin", admin)

    def node_kubeconfig(self, node: str) -> Path:
        """A node agent's credentials: ``system:node:<node>``, as a kubelet's."""
        pair = self.pki.issue(f"node-{node}", f"system:node:{node}", ("system:nodes",))
        return write_kubeconfig(self.root / f"node-{node}.kubeconfig", self.server, self.pki.ca.cert,
                                f"system:node:{node}", pair)

    def kubelet_serving(self, node: str) -> KeyPair:
        """The serving certificate of a node agent's kubelet API (kube-apiserver checks it against the CA)."""
        return self.pki.issue(f"kubelet-{node}", f"system:node:{node}", ("system:nodes",),
                              server_names=("127.0.0.1", node), client=False)

    def request(self, path: str, method: str = "GET", body: Any = None) -> Any:
        """One admin request to kube-apiserver (JSON in and out)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.server}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=self._admin_tls(), timeout=30) as answer:
            return json.loads(answer.read() or b"null")

    def _wait_ok(self, component: Component, url: str, context: ssl.SSLContext) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if not component.alive():
                raise ControlPlaneError(component.died_because())
            try:
                with urllib.request.urlopen(url, context=context, timeout=5) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"{component.name} not ready at {url} after {START_TIMEOUT_S:.0f} s; "
                                        f"see {component.log_path}")
            time.sleep(0.2)

    def _wait_for_default_account(self) -> None:
        """kube-controller-manager's service-account controller has made ``default/default``: pods can be
        admitted (the ServiceAccount admission plugin refuses a pod whose account does not exist yet)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                self.request("/api/v1/namespaces/default/serviceaccounts/default")
                return
            except urllib.error.HTTPError as exc:
                if exc.code != 404 or time.monotonic() > deadline:
                    raise ControlPlaneError(f"no default ServiceAccount: {exc}") from None
            time.sleep(0.2)


def _delegated(kubeconfig: Path) -> list[str]:
    """The flags that give a controller its API credentials and let it authenticate and authorize its own
    endpoints through kube-apiserver."""
    return [f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1", "--leader-elect=false"]


def _insecure_tls() -> ssl.SSLContext:
    """For the controllers' /healthz: they serve it with a self-signed certificate of their own."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context
