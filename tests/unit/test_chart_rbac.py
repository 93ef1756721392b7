"""The chart grants exactly what the operator's code declares (``ascend_operator.client.permissions.rules()``), in
both install modes; a new ``@uses`` in the operator without ``make crds`` fails here."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import helm_python as helm
import pytest
import yaml

from ascend_operator.client.rbac import LEADER_ELECTION_RULES, rules

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "ascend-train-operator"
WATCHED = ["team-a", "team-b"]


def _generator():
    spec = importlib.util.spec_from_file_location("rbac_rules", ROOT / "charts" / "rbac_rules.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rendered_rbac(values: dict) -> list[dict]:
    with helm.Chart.load(CHART) as chart:
        text = chart.render(values, name="ato", namespace="ops")["ascend-train-operator/templates/rbac.yaml"]
    return [d for d in yaml.safe_load_all(text) if d]


def grants(docs: list[dict]) -> dict[str | None, set[tuple[str, str, str]]]:
    """Namespace (None: cluster-wide) -> {(group, resource, verb)} the service account holds there."""
    out: dict[str | None, set] = {}
    for doc in docs:
        if doc["kind"] not in ("ClusterRole", "Role"):
            continue
        where = doc["metadata"].get("namespace") if doc["kind"] == "Role" else None
        for rule in doc["rules"]:
            out.setdefault(where, set()).update(
                (g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"])
    return out


def needed(rule_list) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rule_list for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


def ungranted(rule_list, docs: list[dict], namespaces: list[str] | None) -> set[tuple[str, str, str]]:
    """What the operator needs but the rendered RBAC does not give it (in every watched namespace)."""
    held = grants(docs)
    cluster = held.get(None, set())
    cluster_scoped = {(r["apiGroups"][0], r["resources"][0]) for r in _generator().render_split()["clusterScoped"]}
    missing = set()
    for g, r, v in needed(rule_list):
        if (g, r, v) in cluster:
            continue
        if namespaces is None or (g, r) in cluster_scoped or \
                any((g, r, v) not in held.get(ns, set()) for ns in namespaces):
            missing.add((g, r, v))
    return missing


def test_generated_rules_file_is_current():
    committed = (CHART / "files" / "rbac-rules.yaml").read_text()
    assert committed == _generator().render(), "the operator's permissions changed: run `make crds`"


@pytest.mark.parametrize("values, namespaces", [
    ({}, None),
    ({"watch": {"clusterWide": False, "namespaces": WATCHED}}, WATCHED),
])
def test_chart_grants_every_verb_the_operator_uses(values, namespaces):
    assert not ungranted(rules(), rendered_rbac(values), namespaces)


def test_a_new_verb_in_the_operator_is_caught():
    """What the check reports when the operator starts calling something the chart does not grant."""
    new_call = {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}
    for values, namespaces in (({}, None), ({"watch": {"clusterWide": False, "namespaces": WATCHED}}, WATCHED)):
        assert ungranted(rules() + [new_call], rendered_rbac(values), namespaces) == {("", "secrets", "get")}


def test_namespaced_install_grants_nothing_namespaced_cluster_wide():
    docs = rendered_rbac({"watch": {"clusterWide": False, "namespaces": WATCHED}})
    held = grants(docs)
    assert set(held) == {None, "ops", *WATCHED}
    split = _generator().render_split()
    assert held[None] == needed(split["clusterScoped"])
    assert not any(g == "kopf.dev" for g, _, _ in held[None])  # no cluster-scoped peering rules
    for ns in WATCHED:
        assert held[ns] == needed(split["namespaced"])
    assert held["ops"] == needed(split["leaderElection"])  # the Lease, in the operator's namespace only
    bindings = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert len(bindings) == 2 + len(WATCHED)
    for b in bindings:
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "ato-ascend-train-operator", "namespace": "ops"}]


def test_cluster_wide_install_grants_exactly_the_declared_rules():
    held = grants(rendered_rbac({}))
    assert set(held) == {None, "ops"} and held[None] == needed(rules())
    assert held["ops"] == needed(LEADER_ELECTION_RULES)
    assert not any(v == "update" for g, r, v in held[None] if g == "ascendtrain.dev")  # kopf only patches
    assert not any(g == "events.k8s.io" or (r.endswith("/status") and v == "get") for g, r, v in held[None])


def test_rbac_can_be_left_to_the_platform_team():
    assert rendered_rbac({"rbac": {"create": False}}) == []
