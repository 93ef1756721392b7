"""The operator's RBAC rules, for the Helm chart and the local cluster: every permission the modules that call the
API declare (``permissions.uses``), collected by importing them all here, above them."""
from __future__ import annotations

from ..cache import job_informer, pod_informer  # noqa: F401  (their @uses declarations run on import)
from . import kubeclient  # noqa: F401  (their @uses declarations run on import)
from .permissions import used

# Leader election (leader_election.py): the Lease in the operator's own namespace only, so the chart grants it
# with a Role there, apart from the rules above.
LEADER_ELECTION_RULES = [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                          "verbs": ["create", "get", "update"]}]


def rules() -> list[dict[str, list[str]]]:
    """RBAC rules, one per group and resource, verbs sorted: the chart's ClusterRole/Role."""
    return [{"apiGroups": [group], "resources": [resource], "verbs": sorted(verbs)}
            for (group, resource), verbs in sorted(used().items())]
