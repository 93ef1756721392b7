"""kube-scheduler's filter plugins, for the emulated scheduler: which nodes can take a pod, and why not.

Each filter returns the reasons a node fails it, in kube-scheduler's words (those ``kubectl describe pod`` shows in
FailedScheduling: ``Insufficient huawei.com/Ascend910``, ``node(s) didn't match Pod's node affinity/selector``).
They run in kube-scheduler's order and a node stops at the first filter it fails, as there; the message sums
the reasons over all nodes (``0/3 nodes are available: 1 Insufficient cpu, 2 node(s) were unschedulable.``).

Covered: NodeUnschedulable, NodeName, TaintToleration (NoSchedule and NoExecute), NodeAffinity (nodeSelector and
required nodeAffinity: matchExpressions In/NotIn/Exists/DoesNotExist/Gt/Lt, matchFields metadata.name),
NodeResourcesFit (cpu, memory, pods, extended resources) and InterPodAffinity (required podAffinity and
podAntiAffinity, the pod's and the existing pods'). Not covered: preferred (soft) terms and scoring beyond
"least requested", volumes, ports, topology spread, namespaceSelector (an empty one means all namespaces).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any, Callable

from kubernetes.utils.quantity import parse_quantity

NO_EFFECTS = ("NoSchedule", "NoExecute")  # PreferNoSchedule only scores
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
DEFAULT_SCHEDULER = "default-scheduler"

Pod = dict[str, Any]
Node = dict[str, Any]


def quantity(value: Any) -> Fraction:
    return Fraction(parse_quantity(str(value)))


def pod_requests(pod: Pod) -> dict[str, Fraction]:
    """What the pod asks for: containers' requests summed (a limit alone counts as the request, as the API server
    defaults it), the larger of that and any one init container's, plus one ``pods``."""
    def of(container: Mapping[str, Any]) -> dict[str, Fraction]:
        resources = container.get("resources") or {}
        return {name: quantity(v) for name, v in {**(resources.get("limits") or {}),
                                                  **(resources.get("requests") or {})}.items()}

    spec = pod.get("spec") or {}
    total: dict[str, Fraction] = {}
    for container in spec.get("containers") or []:
        for name, amount in of(container).items():
            total[name] = total.get(name, Fraction(0)) + amount
    for container in spec.get("initContainers") or []:
        for name, amount in of(container).items():
            total[name] = max(total.get(name, Fraction(0)), amount)
    total["pods"] = Fraction(1)
    return total


def occupies_node(pod: Pod) -> bool:
    """A pod bound to a node that the scheduler still counts there (until it ends or is removed)."""
    return bool((pod.get("spec") or {}).get("nodeName")) and \
        (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


# -- label selectors and node selector terms -----------------------------------------------------

def _expression(labels: Mapping[str, str], expr: Mapping[str, Any]) -> bool:
    key, op, values = expr.get("key", ""), expr.get("operator", ""), expr.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels and values:
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def label_selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector; a null selector matches nothing, an empty one everything."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    return all(_expression(labels, e) for e in selector.get("matchExpressions") or [])


def _term_matches(term: Mapping[str, Any], node: Node) -> bool:
    expressions, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches no node
    labels = node["metadata"].get("labels") or {}
    node_fields = {"metadata.name": node["metadata"]["name"]}
    return all(_expression(labels, e) for e in expressions) and all(_expression(node_fields, f) for f in fields)


# -- the filters ----------------------------------------------------------------------------------

def node_unschedulable(pod: Pod, node: Node, _: Any) -> list[str]:
    if not (node.get("spec") or {}).get("unschedulable"):
        return []
    taint = {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}
    if any(tolerates(t, taint) for t in (pod.get("spec") or {}).get("tolerations") or []):
        return []
    return ["node(s) were unschedulable"]


def node_name(pod: Pod, node: Node, _: Any) -> list[str]:
    wanted = (pod.get("spec") or {}).get("nodeName")
    return ["node(s) didn't match the requested node name"] if wanted and wanted != node["metadata"]["name"] else []


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint.get("key")
    return toleration.get("key") == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


def untolerated(pod: Pod, taints: Iterable[Mapping[str, Any]], effects: tuple[str, ...]) -> list[Mapping[str, Any]]:
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    return [t for t in taints if t.get("effect") in effects and not any(tolerates(tol, t) for tol in tolerations)]


def taint_toleration(pod: Pod, node: Node, _: Any) -> list[str]:
    bad = untolerated(pod, (node.get("spec") or {}).get("taints") or [], NO_EFFECTS)
    return [f"node(s) had untolerated taint {{{bad[0]['key']}: {bad[0].get('value') or ''}}}"] if bad else []


def node_affinity(pod: Pod, node: Node, _: Any) -> list[str]:
    spec = pod.get("spec") or {}
    labels = node["metadata"].get("labels") or {}
    ok = all(labels.get(k) == v for k, v in (spec.get("nodeSelector") or {}).items())
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if ok and required is not None:
        ok = any(_term_matches(term, node) for term in required.get("nodeSelectorTerms") or [])
    return [] if ok else ["node(s) didn't match Pod's node affinity/selector"]


def resources_fit(pod: Pod, node: Node, placed: Mapping[str, list[Pod]]) -> list[str]:
    allocatable = {k: quantity(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()}
    used: dict[str, Fraction] = {}
    for other in placed.get(node["metadata"]["name"], []):
        for name, amount in pod_requests(other).items():
            used[name] = used.get(name, Fraction(0)) + amount
    reasons = []
    for name, amount in sorted(pod_requests(pod).items()):
        if amount > 0 and used.get(name, Fraction(0)) + amount > allocatable.get(name, Fraction(0)):
            reasons.append("Too many pods" if name == "pods" else f"Insufficient {name}")
    return reasons


def _affinity_terms(pod: Pod, kind: str) -> list[Mapping[str, Any]]:
    return ((((pod.get("spec") or {}).get("affinity") or {}).get(kind) or {})
            .get("requiredDuringSchedulingIgnoredDuringExecution") or [])


def _term_selects(term: Mapping[str, Any], owner: Pod, other: Pod) -> bool:
    """Whether pod affinity ``term`` of ``owner`` selects ``other`` (namespaces default to the owner's)."""
    namespaces = term.get("namespaces") or ([] if term.get("namespaceSelector") is not None
                                            else [owner["metadata"].get("namespace")])
    if namespaces and other["metadata"].get("namespace") not in namespaces:
        return False
    return label_selector_matches(term.get("labelSelector"), other["metadata"].get("labels") or {})


def inter_pod_affinity(pod: Pod, node: Node, placed: Mapping[str, list[Pod]],
                       nodes: Mapping[str, Node]) -> list[str]:
    def domain(n: Node, key: str) -> str | None:
        return (n["metadata"].get("labels") or {}).get(key)

    def same_domain(other: Pod, key: str) -> bool:
        host = nodes.get(other["spec"]["nodeName"])
        value = domain(node, key)
        return host is not None and value is not None and domain(host, key) == value

    existing = [p for pods in placed.values() for p in pods]
    # kube-scheduler's order: the pod's affinity, its anti-affinity, then the existing pods' anti-affinity.
    for term in _affinity_terms(pod, "podAffinity"):
        key = term.get("topologyKey", "")
        if any(_term_selects(term, pod, o) and same_domain(o, key) for o in existing):
            continue
        # The first pod of a group that selects itself may go anywhere the topology key exists.
        if not any(_term_selects(term, pod, o) for o in existing) and _term_selects(term, pod, pod) \
                and domain(node, key) is not None:
            continue
        return ["node(s) didn't match pod affinity rules"]
    for term in _affinity_terms(pod, "podAntiAffinity"):
        if any(_term_selects(term, pod, o) and same_domain(o, term.get("topologyKey", "")) for o in existing):
            return ["node(s) didn't match pod anti-affinity rules"]
    for other in existing:  # the existing pods' anti-affinity against this one
        for term in _affinity_terms(other, "podAntiAffinity"):
            if _term_selects(term, other, pod) and same_domain(other, term.get("topologyKey", "")):
                return ["node(s) didn't satisfy existing pods anti-affinity rules"]
    return []


FILTERS: list[Callable[[Pod, Node, Mapping[str, list[Pod]]], list[str]]] = [
    node_unschedulable, node_name, taint_toleration, node_affinity, resources_fit]


def unfit_reasons(pod: Pod, node: Node, placed: Mapping[str, list[Pod]], nodes: Mapping[str, Node]) -> list[str]:
    """Why ``node`` cannot take ``pod`` (empty: it can), stopping at the first failing filter."""
    for check in FILTERS:
        if reasons := check(pod, node, placed):
            return reasons
    return inter_pod_affinity(pod, node, placed, nodes)


def free_share(pod: Pod, node: Node, placed: Mapping[str, list[Pod]]) -> Fraction:
    """kube-scheduler's LeastAllocated score, simplified: the share of the node's allocatable left after placing
    the pod, averaged over the resources the pod asks for (a pod asking for nothing weighs by pod count)."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    asked = pod_requests(pod)
    shares = []
    for name, amount in asked.items():
        total = quantity(allocatable.get(name, 0))
        if total <= 0:
            continue
        used = sum((pod_requests(o).get(name, Fraction(0)) for o in placed.get(node["metadata"]["name"], [])),
                   Fraction(0))
        shares.append((total - used - amount) / total)
    return sum(shares, Fraction(0)) / len(shares) if shares else Fraction(0)


def unschedulable_message(node_count: int, reasons: Counter[str]) -> str:
    """kube-scheduler's FitError text: "<count> <reason>" for each reason, sorted as strings (count first)."""
    text = ", ".join(sorted(f"{count} {reason}" for reason, count in reasons.items()))
    return f"0/{node_count} nodes are available: {text}." if text else f"0/{node_count} nodes are available."


def choose_node(pod: Pod, nodes: list[Node], placed: Mapping[str, list[Pod]]) -> tuple[str | None, str]:
    """(the node to bind ``pod`` to, "") or (None, the FailedScheduling message)."""
    by_name = {n["metadata"]["name"]: n for n in nodes}
    reasons: Counter[str] = Counter()
    feasible = []
    for node in nodes:
        why = unfit_reasons(pod, node, placed, by_name)
        if why:
            reasons.update(why)
        else:
            feasible.append(node)
    if not feasible:
        return None, unschedulable_message(len(nodes), reasons)
    feasible.sort(key=lambda n: n["metadata"]["name"])  # ties go to the first name
    best = max(feasible, key=lambda n: free_share(pod, n, placed))
    return best["metadata"]["name"], ""
