"""Every API permission the operator uses, collected from the code itself: the Helm chart's RBAC is rendered
from this list (``rbac.py``; a test fails if the operator calls something the chart does not grant).

``Kube`` methods declare theirs with ``@uses(...)``; kopf's own needs are declared here.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable, TypeVar

from ..api.group import API_GROUP, KINDS

F = TypeVar("F", bound=Callable)

_USED: dict[tuple[str, str], set[str]] = defaultdict(set)


def uses(group: str, resource: str, *verbs: str) -> Callable[[F], F]:
    """Declare that the decorated call needs ``verbs`` on ``group/resource``."""
    _USED[(group, resource)].update(verbs)

    def mark(fn: F) -> F:
        return fn
    return mark


def uses_on_kinds(subresource: str, *verbs: str) -> Callable[[F], F]:
    """``uses`` on each of our kinds (``subresource`` is "" or "/status")."""
    for kind in KINDS:
        uses(API_GROUP, kind.plural + subresource, *verbs)
    return lambda fn: fn


# The job informers (job_informer.py) list and watch the custom resources; kopf may patch them (its annotations,
# status) with merge patches only (no "update", no reads of /status), posts core/v1 Events and discovers resources.
for _kind in KINDS:
    uses(API_GROUP, _kind.plural, "list", "watch", "patch")
    uses(API_GROUP, f"{_kind.plural}/status", "patch")
uses("", "events", "create")
uses("", "namespaces", "list", "watch")
uses("apiextensions.k8s.io", "customresourcedefinitions", "list", "watch")
# The operator watches its pods (kopf.on.event on pods).
uses("", "pods", "list", "watch")
# Kueue (kueue/integration.py): the Workload informer lists and watches Workloads.
uses("kueue.x-k8s.io", "workloads", "list", "watch")


def used() -> dict[tuple[str, str], set[str]]:
    """What has been declared so far: (group, resource) -> verbs (``rbac.rules`` imports every declaring module
    first)."""
    return {key: set(verbs) for key, verbs in _USED.items()}
