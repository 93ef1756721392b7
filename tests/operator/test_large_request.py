"""A request over kube-apiserver's body limit (3 MiB) is named as what the server refused, not as a cluster that
cannot be reached: past some size the server closes the connection before the client has sent the whole body, and
the client saw only a broken connection (issue 52: `ascend-train apply` said "cannot reach the local cluster ... is
`ascend-train local up` running?"). The CLI prints the error as "Error from server: <message>"."""
from __future__ import annotations

import pytest

from ascend_cluster.resource_client import ApiRequestError, ResourceClient


def _config_map(namespace: str, size: int) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big", "namespace": namespace},
            "data": {"blob": "a" * size}}


def test_an_oversized_apply_says_request_entity_too_large(kubeconfig, namespace):
    with ResourceClient(kubeconfig) as resources:
        with pytest.raises(ApiRequestError) as refused:
            resources.apply(_config_map(namespace, 16_000_000), namespace)  # the server drops the connection
        assert refused.value.status == 413, refused.value.message
        assert refused.value.message.startswith("Request entity too large: limit is 3145728 (this request is "), \
            refused.value.message
        with pytest.raises(ApiRequestError) as refused:  # under the limit: the server's own answer, as before
            resources.apply(_config_map(namespace, 1_100_000), namespace)
        assert "Too long: may not be more than 1048576 bytes" in refused.value.message
