"""The test session's real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, started
once by ``ascend_cluster.controlplane``, the CRDs installed), and a namespace of its own for each test.

The session's control plane has no nodes: a pod the operator creates stays Pending, and a test that plays the
kubelet patches its status. Tests that run pods start a ``LocalCluster`` (its own control plane and node agents).
"""
from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from ascend_cluster.cluster import REPO_CRDS, install_crds
from ascend_cluster.controlplane import ControlPlane, write_kubeconfig
from ascend_cluster.resource_client import ResourceClient

SESSION_NODE_GRACE_S = 5.0


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory) -> Iterator[ControlPlane]:
    plane = ControlPlane(tmp_path_factory.mktemp("control-plane"), node_grace_s=SESSION_NODE_GRACE_S,
                         fast_storage=True).start()
    try:
        with ResourceClient(plane.kubeconfig) as resources:
            install_crds(resources, REPO_CRDS)
        yield plane
    finally:
        plane.stop()


def _namespace_name(test: str) -> str:
    stem = re.sub(r"[^a-z0-9-]+", "-", test.lower()).strip("-")[:40].strip("-")
    return f"{stem}-{hashlib.sha1(f'{test}{time.time_ns()}'.encode()).hexdigest()[:5]}"


@pytest.fixture
def namespace(control_plane: ControlPlane, request) -> Iterator[str]:
    """A fresh namespace for this test, with its ``default`` ServiceAccount (made by kube-controller-manager)
    already there; deleted (not waited for) after the test."""
    name = _namespace_name(request.node.name.replace("test_", "", 1))
    control_plane.request("/api/v1/namespaces", "POST", {"metadata": {"name": name}})
    deadline = time.monotonic() + 30
    while True:
        try:
            control_plane.request(f"/api/v1/namespaces/{name}/serviceaccounts/default")
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    yield name
    control_plane.request(f"/api/v1/namespaces/{name}", "DELETE")


@pytest.fixture
def kubeconfig(control_plane: ControlPlane, namespace: str, tmp_path: Path) -> Path:
    """The admin's kubeconfig with this test's namespace as the context's namespace."""
    admin = control_plane.pki.issue("admin", "kubernetes-admin", ("system:masters",))
    return write_kubeconfig(tmp_path / "kubeconfig", control_plane.server, control_plane.pki.ca.cert,
                            "kubernetes-admin", admin, namespace)


@pytest.fixture
def api_client(kubeconfig: Path) -> Iterator[client.ApiClient]:
    """A ``kubernetes`` client configured from the test's kubeconfig, as a user's tool would be."""
    configuration = client.Configuration()
    config.load_kube_config(str(kubeconfig), client_configuration=configuration)
    with client.ApiClient(configuration) as api:
        yield api
