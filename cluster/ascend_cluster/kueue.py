"""Kueue's manager against the local control plane: its CRDs, webhooks and RBAC as its release installs them, and
the ``kueue`` binary built from its own module (``build.KUEUE``) as a child process.

What Kueue's kustomize install does is done here from the same files of the module (``config/components`` in the
Go module cache), with three changes for a control plane on loopback, the ones envtest makes:

* the webhooks and the CRDs' conversion webhooks name ``https://127.0.0.1:<port>/<path>`` (``clientConfig.url``)
  instead of the ``kueue-webhook-service`` Service (no kube-proxy here to reach a Service), with the cluster CA as
  ``caBundle``; the serving certificate is issued by the cluster CA for 127.0.0.1 (Kueue's internal certificate
  management is off: it would issue one for the Service's DNS name);
* only the webhooks of Kueue's own kinds and of the frameworks enabled (``integrations.frameworks``) are
  installed: the others would be no-op webhooks on every pod, Deployment or StatefulSet, each a request that
  fails while Kueue is down;
* leader election off, the visibility API server off (it would register an APIService), health, metrics and
  webhook servers on free loopback ports.

Kueue runs as its own ServiceAccount (``kueue-system/kueue-controller-manager``, a token), bound to its release's
``manager-role`` (and the secrets and metrics-auth roles). With internal certificate management off, Kueue v0.17
reads its metrics server's certificate from a fixed path, ``/etc/kueue/metrics/certs/tls.{crt,key}``
(``cmd/kueue/main.go``); so that nothing is written to the host's /etc, the manager runs in a mount namespace of its
own (``unshare``; a user namespace too when not root) where /etc is a folder of the cluster root holding only that
certificate. The manager needs nothing else from /etc: it reaches kube-apiserver by IP with the CA of its
kubeconfig.

``Kueue(control_plane).start()`` installs all of it, starts the manager (log: ``<root>/logs/kueue.log``) and waits
until its readyz answers and a dry-run create goes through its webhooks; ``stop()`` ends it.
"""
from __future__ import annotations

import base64
import copy
import functools
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from . import build
from .controlplane import ControlPlane, ControlPlaneError, write_kubeconfig
from .processes import Component, free_port
from .resource_client import ApiRequestError, ResourceClient

NAMESPACE = "kueue-system"
ACCOUNT = "kueue-controller-manager"
PREFIX = "kueue-"  # the release's kustomize namePrefix
EXTERNAL_FRAMEWORKS = ("AscendTrainJob.v1alpha1.ascendtrain.dev",)
FRAMEWORKS = ("batch/job",)
RBAC_FILES = ("role.yaml", "role_binding.yaml", "manager_secrets_role.yaml", "manager_secrets_role_binding.yaml",
              "metrics_auth_role.yaml", "metrics_auth_role_binding.yaml")
CONVERSION_CRDS = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")  # its patches
METRICS_CERT_DIR = "kueue/metrics/certs"  # under /etc: cmd/kueue/main.go's metricsCertPath
TOKEN_S = 365 * 24 * 3600
START_TIMEOUT_S = 120.0
# Framework name -> the API group of the webhooks it serves (integrations.frameworks' names).
FRAMEWORK_GROUPS = {"batch/job": ("batch", "jobs"), "pod": ("", "pods"), "deployment": ("apps", "deployments"),
                    "statefulset": ("apps", "statefulsets")}


class KueueError(ControlPlaneError):
    """Kueue's manager did not start or is not ready; the message carries the end of its log."""


@functools.cache
def module_dir() -> Path:
    """Kueue's module source at the pinned version."""
    return build.KUEUE.source_dir("sigs.k8s.io/kueue", "Kueue's manifests come from its Go module")


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _kustomized(doc: dict[str, Any]) -> dict[str, Any]:
    """The release's kustomization on an RBAC object: the ``kueue-`` name prefix and the ``kueue-system``
    namespace (for ``system``), on the object, its roleRef and its subjects."""
    doc = copy.deepcopy(doc)
    meta = doc["metadata"]
    meta["name"] = PREFIX + meta["name"]
    if "namespace" in meta:
        meta["namespace"] = NAMESPACE
    if "roleRef" in doc:
        doc["roleRef"]["name"] = PREFIX + doc["roleRef"]["name"]
    for subject in doc.get("subjects") or []:
        subject["name"] = PREFIX + subject["name"]
        subject["namespace"] = NAMESPACE
    return doc


class Kueue:
    def __init__(self, control_plane: ControlPlane, frameworks: tuple[str, ...] = FRAMEWORKS,
                 external_frameworks: tuple[str, ...] = EXTERNAL_FRAMEWORKS, say=print):
        self.control_plane = control_plane
        self.root = control_plane.root / "kueue"
        self.frameworks = tuple(frameworks)
        self.external_frameworks = tuple(external_frameworks)
        self.say = say
        self.component: Component | None = None
        self.webhook_port = self.health_port = self.metrics_port = 0

    @property
    def log_path(self) -> Path:
        return self.control_plane.root / "logs" / "kueue.log"

    def _url(self, path: str) -> dict[str, Any]:
        ca = base64.b64encode(self.control_plane.pki.ca.cert.read_bytes()).decode()
        return {"url": f"https://127.0.0.1:{self.webhook_port}{path}", "caBundle": ca}

    # -- what the release installs ---------------------------------------------------------------

    def crds(self) -> list[dict[str, Any]]:
        """Kueue's CRDs, the conversion webhooks of its kustomization pointed at this manager."""
        found = []
        for path in sorted((module_dir() / "config/components/crd/bases").glob("*.yaml")):
            for doc in _documents(path):
                doc = copy.deepcopy(doc)
                if doc["spec"]["names"]["plural"] in CONVERSION_CRDS:
                    doc["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                        "clientConfig": self._url("/convert"), "conversionReviewVersions": ["v1"]}}
                found.append(doc)
        return found

    def _wanted(self, webhook: dict[str, Any]) -> bool:
        """Kueue's own kinds, and the enabled frameworks' (the others would only be no-op webhooks)."""
        wanted = {FRAMEWORK_GROUPS[f] for f in self.frameworks if f in FRAMEWORK_GROUPS}
        for rule in webhook["rules"]:
            for group in rule["apiGroups"]:
                if group == "kueue.x-k8s.io" or any((group, r.split("/")[0]) in wanted for r in rule["resources"]):
                    return True
        return False

    def webhook_configurations(self) -> list[dict[str, Any]]:
        """The release's webhook configurations, each webhook at ``https://127.0.0.1:<port>/<its path>``, with the
        namespace selectors of its kustomization (pods, Deployments, StatefulSets outside kube-system and
        kueue-system)."""
        configurations = []
        for doc in _documents(module_dir() / "config/components/webhook/manifests.yaml"):
            doc = copy.deepcopy(doc)
            doc["metadata"]["name"] = PREFIX + doc["metadata"]["name"]
            kept = []
            for webhook in doc["webhooks"]:
                if not self._wanted(webhook):
                    continue
                webhook["clientConfig"] = self._url(webhook["clientConfig"]["service"]["path"])
                if any(r["resources"][0] in ("pods", "deployments", "statefulsets") for r in webhook["rules"]):
                    webhook["namespaceSelector"] = {"matchExpressions": [{
                        "key": "kubernetes.io/metadata.name", "operator": "NotIn",
                        "values": ["kube-system", NAMESPACE]}]}
                kept.append(webhook)
            doc["webhooks"] = kept
            configurations.append(doc)
        return configurations

    def rbac(self) -> list[dict[str, Any]]:
        folder = module_dir() / "config/components/rbac"
        account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ACCOUNT, "namespace": NAMESPACE}}
        return [account] + [_kustomized(d) for name in RBAC_FILES for d in _documents(folder / name)]

    def configuration(self) -> dict[str, Any]:
        """The manager's Configuration (config.kueue.x-k8s.io/v1beta2)."""
        return {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
            "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": f"127.0.0.1:{self.metrics_port}"},
            "webhook": {"host": "127.0.0.1", "port": self.webhook_port, "certDir": str(self.root / "webhook-certs")},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "manageJobsWithoutQueueName": False,
            "integrations": {"frameworks": list(self.frameworks),
                             "externalFrameworks": list(self.external_frameworks)},
            "featureGates": {"VisibilityOnDemand": False},
        }

    # -- start and stop --------------------------------------------------------------------------

    def _certificates(self) -> None:
        """The webhook server's certificate (tls.crt/tls.key, the names controller-runtime reads) and the metrics
        server's, under the folder that is /etc in the manager's mount namespace."""
        pki = self.control_plane.pki
        pair = pki.issue("kueue-webhook", "kueue-webhook", server_names=("127.0.0.1", "localhost"), client=False)
        for folder in (self.root / "webhook-certs", self.root / "etc" / METRICS_CERT_DIR):
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(pair.cert, folder / "tls.crt")
            shutil.copyfile(pair.key, folder / "tls.key")
            os.chmod(folder / "tls.key", 0o600)

    def _install(self, resources: ResourceClient) -> str:
        """CRDs (waited for), namespace, RBAC and webhooks; the ServiceAccount's token."""
        names = []
        for crd in self.crds():
            resources.apply(crd)
            names.append(crd["metadata"]["name"])
        resources.wait_established(names)
        resources.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for obj in self.rbac() + self.webhook_configurations():
            resources.apply(obj)
        return resources.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{ACCOUNT}/token",
                                 {"spec": {"expirationSeconds": TOKEN_S}})["status"]["token"]

    def _argv(self, binary: Path, config: Path) -> list[str]:
        """The manager in a mount namespace whose /etc is ``<root>/kueue/etc`` (its metrics certificate)."""
        unshare = shutil.which("unshare")
        if unshare is None:
            raise KueueError("Kueue's manager reads its metrics certificate from /etc/kueue/metrics/certs; running "
                             "it with a certificate of the cluster's needs `unshare` (util-linux), not found")
        namespaces = ["--mount"] if os.geteuid() == 0 else ["--user", "--map-root-user", "--mount"]
        script = 'mount --bind "$0" /etc && exec "$@"'
        return [unshare, *namespaces, "--propagation", "private", "sh", "-c", script, str(self.root / "etc"),
                str(binary), f"--config={config}", "--zap-log-level=2"]

    def start(self) -> Kueue:
        binary = build.binaries(build.KUEUE, say=self.say) / "kueue"
        started = time.monotonic()
        self.root.mkdir(parents=True, exist_ok=True)
        self.webhook_port, self.health_port, self.metrics_port = free_port(), free_port(), free_port()
        self._certificates()
        with ResourceClient(self.control_plane.kubeconfig) as resources:
            token = self._install(resources)
        kubeconfig = write_kubeconfig(self.root / "kubeconfig", self.control_plane.server,
                                      self.control_plane.pki.ca.cert,
                                      f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}", token, NAMESPACE)
        config = self.root / "config.yaml"
        config.write_text(yaml.safe_dump(self.configuration(), sort_keys=False))
        self.component = Component("kueue", self._argv(binary, config), self.log_path,
                                   env=dict(os.environ, KUBECONFIG=str(kubeconfig))).start()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.say(f"kueue up in {time.monotonic() - started:.1f} s "
                 f"(kueue {build.KUEUE.required_version('sigs.k8s.io/kueue')}, webhooks on 127.0.0.1:"
                 f"{self.webhook_port})", flush=True)
        return self

    def _wait_ready(self) -> None:
        """readyz (the webhook server listens), then a dry-run create through the webhooks of ResourceFlavor."""
        assert self.component is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        probe = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                 "metadata": {"name": "kueue-readiness-probe"}}
        ready, last = False, ""
        with ResourceClient(self.control_plane.kubeconfig) as resources:
            while True:
                if not self.component.alive():
                    raise KueueError(self.component.died_because())
                try:
                    if not ready:
                        with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=5) as a:
                            ready = a.status == 200
                    if ready:
                        resources.request("POST", "/apis/kueue.x-k8s.io/v1beta2/resourceflavors", probe,
                                          {"dryRun": "All"})
                        return
                except (urllib.error.URLError, OSError, ApiRequestError) as exc:
                    last = str(exc)
                if time.monotonic() > deadline:
                    raise KueueError(f"kueue not ready after {START_TIMEOUT_S:.0f} s ({last}); see {self.log_path}")
                time.sleep(0.2)

    def stop(self) -> None:
        if self.component is not None:
            self.component.stop()
            self.component = None

    def __enter__(self) -> Kueue:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
