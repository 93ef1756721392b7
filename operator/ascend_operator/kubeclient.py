"""The operator's access to the Kubernetes API: the official client, plain dicts in and out.

Loads in-cluster credentials in a pod and ``KUBECONFIG`` elsewhere (the local cluster writes one).
"""
from __future__ import annotations

from functools import cached_property
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from .api.group import API_GROUP, API_VERSION, KINDS
from .permissions import uses, uses_on_kinds

_PLURALS = {k.kind: k.plural for k in KINDS}


class Kube:
    def __init__(self) -> None:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        self.api = client.ApiClient()

    @cached_property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @cached_property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def plain(self, obj: Any) -> dict[str, Any]:
        """A client model as the API's own JSON (camelCase), so the operator's code reads like the API docs."""
        return self.api.sanitize_for_serialization(obj)

    @uses("", "pods", "create", "get")
    @uses("", "services", "create", "get")
    @uses("", "configmaps", "create", "get")
    def create(self, namespace: str, body: dict[str, Any]) -> bool:
        """Create if absent; returns False when it already existed (reconciling twice creates nothing twice)."""
        creators = {
            "Pod": self.core.create_namespaced_pod,
            "Service": self.core.create_namespaced_service,
            "ConfigMap": self.core.create_namespaced_config_map,
        }
        try:
            creators[body["kind"]](namespace, body)
            return True
        except ApiException as e:
            if e.status == 409:
                return False
            raise

    @uses("", "pods", "list")
    def list_pods(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        return self.plain(self.core.list_namespaced_pod(namespace, label_selector=selector))["items"]

    @uses_on_kinds("", "get")
    def get_custom(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, _PLURALS[kind], name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    @uses_on_kinds("/status", "patch")
    def patch_status(self, kind: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object_status(
            API_GROUP, API_VERSION, namespace, _PLURALS[kind], name, {"status": status})
