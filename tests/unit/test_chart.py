"""The Helm chart, rendered through Helm's Go SDK (helm-python-sdk): every object parses into the Kubernetes
client's models, the values schema rejects bad values with a message, the CRDs are the generated ones, and the
Deployment's arguments are ones the operator's own CLI accepts."""
from __future__ import annotations

from pathlib import Path

import helm_python as helm
import pytest
import yaml
from kubernetes import client

from ascend_operator.api.crdgen import render_all
from ascend_operator.api.group import LABEL_JOB_NAME, LABEL_REPLICA_INDEX
from ascend_operator.api.immutability import render as immutable_spec
from ascend_operator.api.runtime_locks import render_admission

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "ascend-train-operator"

NAMESPACED = {"watch": {"clusterWide": False, "namespaces": ["team-a", "team-b"]}}
HA = {"replicas": 2, "leaderElection": {"leaseName": "ato-ha", "leaseDurationSeconds": 20}}
MONITORS = {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
                        "podMonitor": {"enabled": True, "port": 9500}}}
CUSTOM = {"image": {"repository": "registry.example/ato", "tag": "1.2.3", "pullPolicy": "Always"},
          "imagePullSecrets": [{"name": "regcred"}], "extraEnv": [{"name": "TZ", "value": "UTC"}],
          "nodeSelector": {"kubernetes.io/arch": "arm64"}, "tolerations": [{"operator": "Exists"}],
          "progressInterval": 2.5, "verbose": True, "serviceAccount": {"create": False, "name": "existing"}}
VARIANTS = {"defaults": {}, "namespaced": NAMESPACED, "ha": HA, "ha-namespaced": {**HA, **NAMESPACED},
            "monitors": MONITORS, "custom": CUSTOM}

# Kinds the Kubernetes client has models for; the others are checked by hand below.
MODELS = {"Deployment": "V1Deployment", "Service": "V1Service", "ServiceAccount": "V1ServiceAccount",
          "ClusterRole": "V1ClusterRole", "ClusterRoleBinding": "V1ClusterRoleBinding", "Role": "V1Role",
          "RoleBinding": "V1RoleBinding", "ValidatingAdmissionPolicy": "V1ValidatingAdmissionPolicy",
          "ValidatingAdmissionPolicyBinding": "V1ValidatingAdmissionPolicyBinding", "Job": "V1Job"}


@pytest.fixture(scope="module")
def chart():
    with helm.Chart.load(CHART) as c:
        yield c


def render(chart, values: dict) -> list[dict]:
    out = chart.render(values, name="ato", namespace="ops")
    docs = []
    for path, text in out.items():
        if not path.endswith(".yaml"):
            continue  # NOTES.txt
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def _drop_nulls(node):
    if isinstance(node, dict):
        return {k: _drop_nulls(v) for k, v in node.items() if v is not None}
    if isinstance(node, list):
        return [_drop_nulls(v) for v in node]
    return node


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_object_parses_into_the_kubernetes_models(chart, variant):
    api = client.ApiClient()
    docs = render(chart, VARIANTS[variant])
    assert by_kind(docs, "Deployment"), "no Deployment rendered"
    for doc in docs:
        assert doc["apiVersion"] and doc["metadata"]["name"], doc
        model = MODELS.get(doc["kind"])
        if model is None:
            assert doc["kind"] in {"ServiceMonitor", "PodMonitor", "ClusterAscendTrainingRuntime"}, doc["kind"]
            continue
        # Deserialising drops keys the model does not know: a misspelt field makes the round trip differ.
        obj = api._ApiClient__deserialize(doc, model)
        assert _drop_nulls(api.sanitize_for_serialization(obj)) == _drop_nulls(doc), doc["kind"]


def _operator_container(docs):
    (deployment,) = by_kind(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


def _operator_args(args: list[str]):
    """How `ascend-operator <args>` parses the Deployment's arguments (the operator itself is not started)."""
    from ascend_operator import main as operator_main

    return operator_main.parse(args)


def test_default_install_watches_the_cluster_with_a_lease_and_locked_down(chart):
    docs = render(chart, {})
    deployment, container = _operator_container(docs)
    # Leader election is on by default, so a rolling update never runs two active operators.
    assert deployment["spec"]["replicas"] == 1 and "strategy" not in deployment["spec"]
    assert container["image"] == f"ascend-train/operator:{chart.metadata['appVersion']}"
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["resources"]["requests"]["cpu"] == "100m"
    env = {e["name"]: e for e in container["env"]}
    assert env["ASCEND_OPERATOR_PROGRESS_INTERVAL"]["value"] == "5"
    assert env["ASCEND_OPERATOR_LEASE_DURATION"]["value"] == "15"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["ASCEND_OPERATOR_ALLOW_HOST_PATH"]["value"] == "false"
    assert env["ASCEND_OPERATOR_ALLOW_HOST_NETWORK"]["value"] == "true"
    args = _operator_args(container["args"])
    assert args.all_namespaces and args.leader_elect and args.leader_election_id == "ascend-train-operator"
    assert args.health == "0.0.0.0:8081"
    # Liveness and readiness ask different questions.
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}


def test_ha_namespaced_install_elects_on_a_lease_in_its_own_namespace(chart):
    docs = render(chart, {**HA, **NAMESPACED})
    deployment, container = _operator_container(docs)
    assert deployment["spec"]["replicas"] == 2 and "strategy" not in deployment["spec"]
    args = _operator_args(container["args"])
    assert not args.all_namespaces and args.namespace == ["team-a", "team-b"]
    assert args.leader_elect and args.leader_election_id == "ato-ha"
    assert {e["name"]: e.get("value") for e in container["env"]}["ASCEND_OPERATOR_LEASE_DURATION"] == "20"
    (role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    assert role["metadata"]["namespace"] == "ops"
    assert role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                              "verbs": ["create", "get", "update"]}]
    assert not any("kopf.dev" in r["apiGroups"] for d in docs if d["kind"] in ("Role", "ClusterRole")
                   for r in d["rules"])


def test_without_leader_election_one_replica_recreates(chart):
    deployment, container = _operator_container(render(chart, {"leaderElection": {"enabled": False}}))
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    args = _operator_args(container["args"])
    assert args.standalone and not args.leader_elect


def test_custom_values_reach_the_pod(chart, monkeypatch):
    docs = render(chart, CUSTOM)
    deployment, container = _operator_container(docs)
    pod = deployment["spec"]["template"]["spec"]
    assert container["image"] == "registry.example/ato:1.2.3" and container["imagePullPolicy"] == "Always"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}] and pod["serviceAccountName"] == "existing"
    assert pod["nodeSelector"] == {"kubernetes.io/arch": "arm64"}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TZ"] == "UTC" and env["ASCEND_OPERATOR_PROGRESS_INTERVAL"] == "2.5"
    assert not by_kind(docs, "ServiceAccount")
    assert "--verbose" in container["args"]


def test_the_operator_reads_the_metrics_port_the_chart_sets(chart, monkeypatch):
    import importlib

    from ascend_operator import settings

    _, container = _operator_container(render(chart, {"metrics": {"port": 9555}}))
    for item in container["env"]:
        if "value" in item:
            monkeypatch.setenv(item["name"], item["value"])
    try:
        assert importlib.reload(settings).METRICS_PORT == 9555
    finally:
        monkeypatch.undo()
        importlib.reload(settings)


def test_metrics_service_and_monitors(chart):
    docs = render(chart, MONITORS)
    (service,) = [s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("-metrics")]
    _, container = _operator_container(docs)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert service["spec"]["ports"][0]["targetPort"] == "metrics" and "metrics" in ports
    assert service["spec"]["selector"].items() <= \
        by_kind(docs, "Deployment")[0]["spec"]["template"]["metadata"]["labels"].items()
    (monitor,) = by_kind(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    (pod_monitor,) = by_kind(docs, "PodMonitor")
    selector = pod_monitor["spec"]["selector"]
    # The labels the operator puts on the pods it creates, rank 0 only.
    assert selector["matchLabels"] == {LABEL_REPLICA_INDEX: "0"}
    assert selector["matchExpressions"][0]["key"] == LABEL_JOB_NAME
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["relabelings"][0]["replacement"] == "$1:9500"
    assert not by_kind(render(chart, {}), "ServiceMonitor")


def test_dashboard_service_reaches_the_operators_dashboard_port(chart):
    docs = render(chart, {})
    (service,) = [s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("-dashboard")]
    _, container = _operator_container(docs)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert service["spec"]["type"] == "ClusterIP" and service["spec"]["ports"][0]["targetPort"] == "dashboard"
    assert ports["dashboard"] == 8080 and env["ASCEND_OPERATOR_DASHBOARD_PORT"] == "8080"
    docs = render(chart, {"dashboard": {"enabled": False}})
    _, container = _operator_container(docs)
    assert not [s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("-dashboard")]
    assert {e["name"]: e.get("value") for e in container["env"]}["ASCEND_OPERATOR_DASHBOARD_PORT"] == "0"


@pytest.mark.parametrize("values, message", [
    ({"replicas": 0}, "/replicas"),
    ({"replicas": 2, "leaderElection": {"enabled": False}}, "/leaderElection/enabled"),
    ({"leaderElection": {"retryPeriodSeconds": 0}}, "/leaderElection/retryPeriodSeconds"),
    ({"watch": {"clusterWide": False}}, "/watch/namespaces"),
    ({"watch": {"clusterWide": False, "namespaces": ["Team_A"]}}, "/watch/namespaces/0"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"metrics": {"enabled": False, "serviceMonitor": {"enabled": True}}}, "/metrics/enabled"),
    ({"metrics": {"port": 70000}}, "/metrics/port"),
    ({"progressInterval": 0}, "/progressInterval"),
    ({"replica": 2}, "'replica' not allowed"),
])
def test_schema_rejects_bad_values_with_a_message(chart, values, message):
    with pytest.raises(helm.HelmValuesError) as err:
        chart.render(values, name="ato", namespace="ops")
    assert message in str(err.value)


def test_chart_crds_are_the_generated_ones(chart):
    carried = {c["filename"].rsplit("/", 1)[-1]: c["data"] for c in chart.crds}
    generated = render_all()
    for name, text in generated.items():
        assert carried.get(name) == text, f"charts/.../crds/{name} drifted: run `make crds`"
    committed = {p.name: p.read_text() for p in (ROOT / "crds").glob("*.yaml")}
    assert committed == {**generated, "runtime-locks.yaml": render_admission(), "immutable-spec.yaml": immutable_spec()}
    assert set(carried) == set(generated)  # no kopf peering CRDs: HA is a Lease


def test_helm_lint_finds_no_errors():
    report = helm.lint(CHART, strict=True)
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report.get("errors", [])
    assert not problems, problems


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_container_port_is_distinct(chart, variant):
    """Two servers on one port: the second one fails to bind and its Service points at the first."""
    _, container = _operator_container(render(chart, VARIANTS[variant]))
    ports = [p["containerPort"] for p in container["ports"]]
    assert len(ports) == len(set(ports)), container["ports"]
    with pytest.raises(Exception, match="health.port, metrics.port and dashboard.port must differ"):
        chart.render({"health": {"port": 9102}}, name="ato", namespace="ops")


def test_job_pod_policy_values_reach_the_operator(chart):
    values = {"jobPodPolicy": {"allowPrivileged": True, "allowedCapabilities": ["SYS_RAWIO", "IPC_LOCK"],
                               "allowPrivilegeEscalation": True, "allowUnmaskedProcMount": True}}
    _, container = _operator_container(render(chart, values))
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["ASCEND_OPERATOR_ALLOW_PRIVILEGED"], env["ASCEND_OPERATOR_ALLOWED_CAPABILITIES"],
            env["ASCEND_OPERATOR_ALLOW_PRIVILEGE_ESCALATION"], env["ASCEND_OPERATOR_ALLOW_UNMASKED_PROC_MOUNT"]) == \
        ("true", "SYS_RAWIO,IPC_LOCK", "true", "true")
    _, container = _operator_container(render(chart, {}))
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["ASCEND_OPERATOR_ALLOW_PRIVILEGED"], env["ASCEND_OPERATOR_ALLOWED_CAPABILITIES"]) == ("false", "")


def test_notes_show_a_job_that_needs_nothing_the_chart_does_not_make(chart):
    notes = chart.render({}, name="ato", namespace="ops")["ascend-train-operator/templates/NOTES.txt"]
    manifest = notes.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    job = yaml.safe_load(manifest)
    assert job["kind"] == "AscendTrainJob" and "persistentVolumeClaim" not in manifest
    assert job["spec"]["image"].endswith(f":{chart.metadata['appVersion']}")
    assert f"kubectl get atj -n ops {job['metadata']['name']} -w" in notes


def test_the_chart_installs_a_cluster_runtime_per_accelerator(chart):
    """ClusterAscendTrainingRuntimes (docs/runtimes.md): each valid for the CRD's model, with its device and image."""
    from ascend_operator.api.runtime import TrainingRuntimeSpec

    docs = by_kind(render(chart, {"trainingRuntimes": {"lockedFields": ["image"], "imageTag": "1.0",
                                                       "hccl": {"socketIfname": "eth0"}}}),
                   "ClusterAscendTrainingRuntime")
    runtimes = {d["metadata"]["name"]: TrainingRuntimeSpec.model_validate(d["spec"]) for d in docs}
    assert set(runtimes) == {"ascend-910b", "ascend-npu", "nvidia-gpu", "cpu"}
    b = runtimes["ascend-910b"].template
    assert (b.devices.resource, b.devices.ringController) == ("huawei.com/Ascend910", "ascend-910b")
    assert b.image == "ascend-train/engine-ascend:1.0" and b.hccl.socketIfname == "eth0"
    assert runtimes["ascend-npu"].template.devices.resource == "huawei.com/npu"
    assert runtimes["nvidia-gpu"].template.image == "ascend-train/engine-cuda:1.0"
    assert runtimes["cpu"].template.devices.resource == "none" and runtimes["cpu"].template.hccl is None
    assert all(r.lockedFields == ["image"] for r in runtimes.values())
    assert not by_kind(render(chart, {"trainingRuntimes": {"create": False}}), "ClusterAscendTrainingRuntime")


def test_the_chart_refuses_locked_fields_at_apply_unless_told_not_to(chart):
    """The ValidatingAdmissionPolicies (and their bindings) for each runtime kind; off for API servers before 1.30."""
    from ascend_operator.api.runtime_locks import admission_objects

    kinds = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")

    def locks(docs):
        return [d for d in docs if d["kind"] in kinds and d["metadata"]["name"].startswith("ascend-train-runtime-locks")]
    docs = locks(render(chart, {}))
    assert docs == admission_objects() and len(docs) == 8
    assert not locks(render(chart, {"trainingRuntimes": {"lockAtApply": False}}))


def test_the_chart_refuses_a_changed_spec_with_the_generated_policies(chart):
    """Immutability is a ValidatingAdmissionPolicy per job kind on updates of the job (not of its status), as the
    local cluster installs it from crds/ (api/immutability.py)."""
    from ascend_operator.api.immutability import admission_objects

    docs = [d for d in render(chart, {}) if d["metadata"]["name"].startswith("ascend-train-immutable-spec")]
    assert docs == admission_objects() and len(docs) == 6
    rules = [d["spec"]["matchConstraints"]["resourceRules"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    assert all(r[0]["operations"] == ["UPDATE"] and "/" not in r[0]["resources"][0] for r in rules)


def test_the_examples_that_name_a_chart_runtime_resolve_against_it(chart):
    """Examples leave the image, devices and HCCL to the chart's runtimes (docs/runtimes.md): merged with the
    runtime they name, each resource is valid for its kind and runs the runtime's image on its devices."""
    from ascend_operator.api.resources import RESOURCES
    from ascend_operator.kinds.runtimes import resolve

    runtimes = {d["metadata"]["name"]: d for d in by_kind(render(chart, {}), "ClusterAscendTrainingRuntime")}
    named = 0
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or "runtimeRef" not in doc.get("spec", {}):
                continue
            named += 1
            model = RESOURCES[doc["kind"]].spec
            merged, recorded = resolve(doc["spec"], None, "team-a", lambda kind, ns, name: runtimes.get(name), model)
            spec = model.model_validate(merged)
            runtime = runtimes[doc["spec"]["runtimeRef"]["name"]]["spec"]["template"]
            assert spec.image == runtime["image"] and recorded["name"] in runtimes, path.name
            if doc["kind"] == "AscendTrainJob":
                assert spec.devices.resource == runtime["devices"]["resource"], path.name
    assert named >= 15
