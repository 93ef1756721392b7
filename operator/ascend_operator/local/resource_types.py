"""What the API server knows about each resource: kind, scope, subresources, and a CRD's schema."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kmock import ResourceInfo, resource

from .crd_schema import CustomResourceSchema

VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    status_subresource: bool = False
    schema: CustomResourceSchema | None = None
    printer_columns: list[dict[str, Any]] = field(default_factory=list)
    crd_name: str | None = None  # the CustomResourceDefinition that registered it

    @property
    def key(self) -> tuple[str, str, str]:
        return self.group, self.version, self.plural

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified_kind(self) -> str:
        """``AscendTrainJob.ascendtrain.dev`` or ``Pod``, as the API server names kinds in error messages."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def qualified_plural(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def discovery(self) -> tuple[resource, ResourceInfo]:
        """The key and value kmock's discovery endpoints (``/api/v1``, ``/apis/<g>/<v>``) serve."""
        info = ResourceInfo(
            namespaced=self.namespaced, kind=self.kind, singular=self.singular or self.kind.lower(),
            verbs=set(VERBS), shortnames=set(self.short_names), categories=set(self.categories),
            subresources={"status"} if self.status_subresource else set(),
        )
        return resource(self.group, self.version, self.plural), info


def _core(plural: str, kind: str, namespaced: bool = True, short: tuple[str, ...] = (), status: bool = False,
          group: str = "", version: str = "v1") -> ResourceType:
    return ResourceType(group, version, plural, kind, namespaced, kind.lower(), short, (), status)


BUILTIN_TYPES: tuple[ResourceType, ...] = (
    _core("namespaces", "Namespace", namespaced=False, short=("ns",), status=True),
    _core("nodes", "Node", namespaced=False, short=("no",), status=True),
    _core("pods", "Pod", short=("po",), status=True),
    _core("services", "Service", short=("svc",), status=True),
    _core("configmaps", "ConfigMap", short=("cm",)),
    _core("secrets", "Secret"),
    _core("persistentvolumeclaims", "PersistentVolumeClaim", short=("pvc",), status=True),
    _core("events", "Event", short=("ev",)),
    _core("serviceaccounts", "ServiceAccount", short=("sa",)),
    _core("priorityclasses", "PriorityClass", namespaced=False, short=("pc",), group="scheduling.k8s.io"),
    _core("events", "Event", short=("ev",), group="events.k8s.io"),
    _core("leases", "Lease", group="coordination.k8s.io"),
    _core("roles", "Role", group="rbac.authorization.k8s.io"),
    _core("rolebindings", "RoleBinding", group="rbac.authorization.k8s.io"),
    _core("clusterroles", "ClusterRole", namespaced=False, group="rbac.authorization.k8s.io"),
    _core("clusterrolebindings", "ClusterRoleBinding", namespaced=False, group="rbac.authorization.k8s.io"),
    _core("customresourcedefinitions", "CustomResourceDefinition", namespaced=False, short=("crd", "crds"),
          status=True, group="apiextensions.k8s.io"),
)

# Namespaces that exist on every fresh cluster.
INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
