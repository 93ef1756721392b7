"""Fixtures for tests against the embedded local cluster's API server."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from ascend_operator.local.apiserver import LocalApiServer


@pytest.fixture
def local_api(tmp_path: Path) -> Iterator[LocalApiServer]:
    """A fresh API server on a free loopback port, with its kubeconfig at ``tmp_path/kubeconfig``."""
    with LocalApiServer() as server:
        server.write_kubeconfig(tmp_path / "kubeconfig")
        yield server


@pytest.fixture
def api_client(local_api: LocalApiServer, tmp_path: Path) -> Iterator[client.ApiClient]:
    """A ``kubernetes`` client configured from the written kubeconfig, as a user's tool would be."""
    configuration = client.Configuration()
    config.load_kube_config(str(tmp_path / "kubeconfig"), client_configuration=configuration)
    with client.ApiClient(configuration) as api:
        yield api
