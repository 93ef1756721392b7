"""The chart's post-delete hook (templates/uninstall-hook.yaml): what `helm uninstall` runs so that no job pod is
left on the operator's pod-tracking finalizer. tests/e2e/test_helm_gitops.py runs it with the real helm."""
from __future__ import annotations

from pathlib import Path

import helm_python as helm
import pytest
import yaml

from ascend_operator.main import parse

CHART = Path(__file__).resolve().parents[2] / "charts" / "ascend-train-operator"


@pytest.fixture(scope="module")
def chart():
    with helm.Chart.load(CHART) as c:
        yield c


def hooks(chart, values: dict) -> list[dict]:
    text = chart.render(values, name="ato", namespace="ops").get("ascend-train-operator/templates/uninstall-hook.yaml",
                                                                 "")
    return [d for d in yaml.safe_load_all(text) if d]


def test_the_hook_runs_release_finalizers_after_the_operator_with_its_own_account(chart):
    docs = hooks(chart, {})
    assert [d["kind"] for d in docs] == ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job"]
    for doc in docs:
        notes = doc["metadata"]["annotations"]
        assert notes["helm.sh/hook"] == "post-delete"
        assert notes["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    weights = [int(d["metadata"]["annotations"]["helm.sh/hook-weight"]) for d in docs]
    assert weights == sorted(weights) and weights[-1] == 0  # the account and its rights exist before the Job
    assert docs[1]["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]}]
    job = docs[-1]["spec"]
    pod = job["template"]["spec"]
    assert pod["serviceAccountName"] == "ato-ascend-train-operator-uninstall" and pod["restartPolicy"] == "Never"
    container = pod["containers"][0]
    assert container["command"] == ["ascend-operator"]
    args = parse(container["args"])  # the operator's own parser takes the rendered arguments
    assert args.command == "release-finalizers" and args.all_namespaces and args.operator_namespace == "ops"
    assert args.operator_selector == "app.kubernetes.io/instance=ato,app.kubernetes.io/name=ascend-train-operator"
    assert args.timeout < job["activeDeadlineSeconds"]
    # The hook's pod is not one of the operator's (it waits for those to be gone).
    labels = job["template"]["metadata"]["labels"]
    assert not all(labels.get(k) == v for k, v in (s.split("=") for s in args.operator_selector.split(",")))


def test_namespaced_installs_release_only_in_their_namespaces(chart):
    docs = hooks(chart, {"watch": {"clusterWide": False, "namespaces": ["team-a", "team-b"]}})
    roles = {d["metadata"]["namespace"] for d in docs if d["kind"] == "Role"}
    assert roles == {"team-a", "team-b", "ops"} and not [d for d in docs if d["kind"].startswith("Cluster")]
    args = parse(docs[-1]["spec"]["template"]["spec"]["containers"][0]["args"])
    assert args.namespace == ["team-a", "team-b"] and not args.all_namespaces


def test_the_hook_can_be_turned_off_and_follows_an_external_account(chart):
    assert hooks(chart, {"uninstall": {"releaseFinalizers": False}}) == []
    docs = hooks(chart, {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "platform-sa"}})
    assert [d["kind"] for d in docs] == ["Job"]
    assert docs[0]["spec"]["template"]["spec"]["serviceAccountName"] == "platform-sa"


def test_an_existing_account_gets_the_hooks_rights_when_the_chart_makes_rbac(chart):
    docs = hooks(chart, {"serviceAccount": {"create": False, "name": "existing"}})
    assert [d["kind"] for d in docs] == ["ClusterRole", "ClusterRoleBinding", "Job"]
    assert docs[1]["subjects"] == [{"kind": "ServiceAccount", "name": "existing", "namespace": "ops"}]
