"""The emulated kube-scheduler's filters: which node a pod goes to, and kube-scheduler's words when none fits."""
from __future__ import annotations

import pytest

from ascend_operator.local.scheduler_filters import choose_node

NPU = "huawei.com/Ascend910"


def node(name: str, labels: dict | None = None, taints: list | None = None, unschedulable: bool = False,
         **allocatable: str) -> dict:
    alloc = {"cpu": "8", "memory": "32Gi", "pods": "110", NPU: "8"} | {k.replace("_", "/"): v
                                                                     for k, v in allocatable.items()}
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"taints": taints or [], "unschedulable": unschedulable}, "status": {"allocatable": alloc}}


def pod(name: str = "p", labels: dict | None = None, requests: dict | None = None, on: str | None = None,
        **spec) -> dict:
    container = {"name": "main", "resources": {"requests": requests or {}}}
    return {"metadata": {"name": name, "namespace": "default", "labels": labels or {}},
            "spec": {"containers": [container], **({"nodeName": on} if on else {}), **spec},
            "status": {"phase": "Running" if on else "Pending"}}


def placed(*pods: dict) -> dict:
    out: dict = {}
    for p in pods:
        out.setdefault(p["spec"]["nodeName"], []).append(p)
    return out


NODES = [node("n1", {"zone": "a"}), node("n2", {"zone": "b"}), node("n3", {"zone": "c"})]


def test_resources_count_what_is_placed_and_name_each_shortage():
    nodes = [node("n1", **{"huawei.com_Ascend910": "2"}), node("n2", cpu="1"), node("n3", pods="1")]
    busy = placed(pod("a", requests={NPU: "1"}, on="n1"), pod("b", on="n3"))
    assert choose_node(pod(requests={NPU: "2", "cpu": "2", "memory": "1Gi"}), nodes, busy) == (
        None, "0/3 nodes are available: 1 Insufficient cpu, 1 Insufficient huawei.com/Ascend910, 1 Too many pods.")
    # A finished pod holds nothing; a limit alone counts as the request.
    assert choose_node(pod(requests={NPU: "2"}), nodes[:1], placed(
        {**pod("a", requests={NPU: "1"}, on="n1"), "status": {"phase": "Succeeded"}}))[0] is None
    limited = pod()
    limited["spec"]["containers"][0]["resources"] = {"limits": {"memory": "64Gi"}}
    assert choose_node(limited, NODES, {})[1] == "0/3 nodes are available: 3 Insufficient memory."


def test_least_allocated_node_wins_and_ties_go_to_the_first_name():
    busy = placed(pod("a", requests={NPU: "4"}, on="n1"))
    assert choose_node(pod(requests={NPU: "2"}), NODES, busy)[0] == "n2"
    assert choose_node(pod(), NODES, {})[0] == "n1"


@pytest.mark.parametrize("expressions, fields, fits", [
    ([{"key": "zone", "operator": "In", "values": ["b", "c"]}], [], ["n2", "n3"]),
    ([{"key": "zone", "operator": "NotIn", "values": ["a"]}], [], ["n2", "n3"]),
    ([{"key": "gpu", "operator": "Exists"}], [], []),
    ([{"key": "gpu", "operator": "DoesNotExist"}], [], ["n1", "n2", "n3"]),
    ([], [{"key": "metadata.name", "operator": "NotIn", "values": ["n1", "n2"]}], ["n3"]),
    ([{"key": "zone", "operator": "In", "values": ["a"]}], [{"key": "metadata.name", "operator": "In",
                                                              "values": ["n2"]}], []),
])
def test_required_node_affinity(expressions, fields, fits):
    term = {k: v for k, v in (("matchExpressions", expressions), ("matchFields", fields)) if v}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    feasible = [n["metadata"]["name"] for n in NODES if choose_node(pod(affinity=affinity), [n], {})[0]]
    assert feasible == fits
    if not fits:
        assert choose_node(pod(affinity=affinity), NODES, {})[1] == \
            "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."


def test_node_selector_and_affinity_must_both_match():
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}}}
    assert choose_node(pod(nodeSelector={"zone": "b"}, affinity=affinity), NODES, {})[0] == "n2"
    assert choose_node(pod(nodeSelector={"zone": "c"}, affinity=affinity), NODES, {})[0] is None


def test_taints_tolerations_cordon_and_not_ready_nodes():
    nodes = [node("n1", taints=[{"key": "dedicated", "value": "train", "effect": "NoSchedule"}]),
             node("n2", taints=[{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]),
             node("n3", unschedulable=True),
             node("n4", taints=[{"key": "soft", "effect": "PreferNoSchedule"}])]
    assert choose_node(pod(), nodes[:3], {})[1] == (
        "0/3 nodes are available: 1 node(s) had untolerated taint {dedicated: train}, 1 node(s) had untolerated "
        "taint {node.kubernetes.io/unreachable: }, 1 node(s) were unschedulable.")
    assert choose_node(pod(), nodes, {})[0] == "n4"  # PreferNoSchedule only scores
    equal = [{"key": "dedicated", "operator": "Equal", "value": "train", "effect": "NoSchedule"}]
    assert choose_node(pod(tolerations=equal), nodes[:3], {})[0] == "n1"
    wrong_value = [{"key": "dedicated", "value": "infer"}]
    assert choose_node(pod(tolerations=wrong_value), nodes[:3], {})[0] is None
    cordon = [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]
    assert choose_node(pod(tolerations=cordon), nodes[:3], {})[0] == "n3"
    assert choose_node(pod(tolerations=[{"operator": "Exists"}]), nodes[1:3], {})[0] == "n2"


def anti(kind: str, labels: dict) -> dict:
    return {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": labels}, "topologyKey": "kubernetes.io/hostname"}]}}


def test_pod_anti_affinity_spreads_one_pod_per_node():
    rank = {"job": "j"}
    busy = placed(pod("j-0", rank, on="n1", affinity=anti("podAntiAffinity", rank)),
                  pod("j-1", rank, on="n2", affinity=anti("podAntiAffinity", rank)))
    assert choose_node(pod("j-2", rank, affinity=anti("podAntiAffinity", rank)), NODES, busy)[0] == "n3"
    assert choose_node(pod("j-2", rank, affinity=anti("podAntiAffinity", rank)), NODES[:2], busy)[1] == \
        "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules."
    # The existing pods' anti-affinity keeps a pod without rules of its own away too.
    assert choose_node(pod("other", rank), NODES[:2], busy)[1] == \
        "0/2 nodes are available: 2 node(s) didn't satisfy existing pods anti-affinity rules."
    # Another namespace is not selected unless the term names it.
    elsewhere = {**pod("x", rank), "metadata": {"name": "x", "namespace": "team", "labels": rank}}
    assert choose_node(elsewhere, NODES[:1], busy)[0] == "n1"


def test_pod_affinity_follows_the_group_and_the_first_pod_goes_anywhere():
    group = {"app": "db"}
    assert choose_node(pod("first", group, affinity=anti("podAffinity", group)), NODES, {})[0] == "n1"
    busy = placed(pod("db-0", group, on="n3"))
    assert choose_node(pod("second", group, affinity=anti("podAffinity", group)), NODES, busy)[0] == "n3"
    assert choose_node(pod("lonely", {}, affinity=anti("podAffinity", group)), NODES, {})[1] == \
        "0/3 nodes are available: 3 node(s) didn't match pod affinity rules."
