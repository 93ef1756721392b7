"""Our product held to kube-apiserver's rules, seen through the real kubectl on the session's control plane: our
CRD's errors name the field once, a merge patch's null brings our schema's default back, the chart's RBAC grants
the operator what it uses and nothing more, the operator's repeated events are one Event with a count, and its pod
policy refuses hostile jobs with the field named."""
from __future__ import annotations

import copy
import json
import re
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request

from ascend_cluster.cluster import operator_rbac
from ascend_cluster.resource_client import ResourceClient
from ascend_operator.api.train_job import AscendTrainJobSpec
from test_kubectl import job_named, kubectl, pytestmark, rows, write  # noqa: F401 -- same binary, same marks
from test_operator_train_job import operator_command, operator_env


def _apply(kubeconfig, obj: dict, *flags: str) -> subprocess.CompletedProcess:
    path = write(kubeconfig.parent, f"{obj['metadata']['name']}.yaml", obj)
    return kubectl(kubeconfig, "apply", *flags, "-f", str(path), check=False)


def test_custom_resource_errors_name_the_field_once(kubeconfig):
    job = job_named("bad-stage")
    job["spec"]["train"]["stage"] = "rlhf"
    result = _apply(kubeconfig, job)
    assert result.returncode != 0 and 'The AscendTrainJob "bad-stage" is invalid' in result.stderr, result.stderr
    assert 'spec.train.stage: Unsupported value: "rlhf": supported values: ' in result.stderr, result.stderr
    assert "spec.train.stage: spec.train.stage" not in result.stderr and "<nil>: <nil>" not in result.stderr


def test_merge_patch_null_removes_a_field_and_the_models_default_applies_again(kubeconfig):
    assert _apply(kubeconfig, job_named("defaulted")).returncode == 0

    def spec() -> dict:
        return json.loads(kubectl(kubeconfig, "get", "atj", "defaulted", "-o", "json").stdout)["spec"]

    # a field no CEL rule reads is not defaulted in the stored job: the operator's model defaults it
    assert "runPolicy" not in spec() and AscendTrainJobSpec.model_validate(spec()).runPolicy.backoffLimit == 3
    kubectl(kubeconfig, "patch", "atj", "defaulted", "--type", "merge", "-p",
            '{"spec": {"runPolicy": {"backoffLimit": 9}}}')
    assert spec()["runPolicy"] == {"backoffLimit": 9}
    kubectl(kubeconfig, "patch", "atj", "defaulted", "--type", "merge", "-p",
            '{"spec": {"runPolicy": {"backoffLimit": null}}}')
    assert spec()["runPolicy"] == {}  # null means "remove"
    assert AscendTrainJobSpec.model_validate(spec()).runPolicy.backoffLimit == 3


def test_status_is_written_through_its_subresource_only(kubeconfig):
    """The operator's status is the status subresource's: a write of the job itself leaves it alone."""
    assert _apply(kubeconfig, job_named("statused")).returncode == 0
    phase = ["get", "atj", "statused", "-o", "jsonpath={.status.phase}"]
    kubectl(kubeconfig, "patch", "atj", "statused", "--type", "merge", "-p", '{"status": {"phase": "Succeeded"}}')
    assert kubectl(kubeconfig, *phase).stdout == ""
    kubectl(kubeconfig, "patch", "atj", "statused", "--subresource=status", "--type", "merge", "-p",
            '{"status": {"phase": "Running"}}')
    assert kubectl(kubeconfig, *phase).stdout == "Running"
    assert json.loads(kubectl(kubeconfig, "get", "atj", "statused", "-o", "json").stdout)["metadata"][
        "generation"] == 1  # a status write is no new generation


def test_the_charts_rbac_grants_what_the_operator_uses_and_no_more(control_plane, namespace):
    """The chart's ServiceAccount, bound to exactly the rules it grants (``ascend_operator.client.permissions``): what the
    operator calls works, Secrets and other namespaces' Leases are kube-apiserver's 403 naming user, verb and
    resource."""
    from ascend_operator.client.rbac import LEADER_ELECTION_RULES, rules

    name = f"ascend-train-operator-{namespace}"  # its ClusterRole and ClusterRoleBinding are the test's own
    objects = operator_rbac(namespace, name, rules(), LEADER_ELECTION_RULES)
    with ResourceClient(control_plane.kubeconfig) as resources:
        try:
            for obj in objects:
                resources.apply(obj, namespace)
            token = resources.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                                      {"spec": {"expirationSeconds": 600}})["status"]["token"]
            tls = ssl.create_default_context(cafile=str(control_plane.pki.ca.cert))

            def ask(path: str, method: str = "GET") -> tuple[int, str]:
                request = urllib.request.Request(control_plane.server + path, method=method,
                                                 headers={"Authorization": f"Bearer {token}"})
                try:
                    with urllib.request.urlopen(request, timeout=10, context=tls) as answer:
                        return answer.status, ""
                except urllib.error.HTTPError as refused:
                    return refused.code, json.loads(refused.read())["message"]

            user = f"system:serviceaccount:{namespace}:{name}"
            assert ask("/apis/ascendtrain.dev/v1alpha1/ascendtrainjobs") == (200, "")
            assert ask(f"/api/v1/namespaces/{namespace}/pods?watch=true&timeoutSeconds=1")[0] == 200
            assert ask(f"/api/v1/namespaces/{namespace}/secrets") == (403, (
                f'secrets is forbidden: User "{user}" cannot list resource "secrets" in API group "" in the '
                f'namespace "{namespace}"'))
            # Its Role grants the leader-election Lease in its own namespace only.
            assert ask("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/x")[0] == 403
            assert ask(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/x")[0] == 404
        finally:
            for obj in objects:
                if obj["kind"].startswith("Cluster"):
                    resources.request("DELETE", f"/apis/rbac.authorization.k8s.io/v1/{obj['kind'].lower()}s/{name}")


def test_the_operators_repeated_events_are_one_event_with_a_count(kubeconfig, namespace, monkeypatch):
    """As client-go's recorder: a repeat bumps count and LAST SEEN of the first Event; a deleted one is made anew."""
    from kubernetes.config import kube_config
    from ascend_operator.client.kubeclient import Kube
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    kube = Kube()
    owner = kube._json("POST", f"/api/v1/namespaces/{namespace}/configmaps", {  # any object with a uid
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "repeated", "namespace": namespace}})
    for _ in range(3):
        kube.post_event(owner, "BackoffLimitExceeded", "pod repeated-0 failed", warning=True)
    kube.post_event(owner, "Restarting", "another reason, another event")
    table = rows(kubectl(kubeconfig, "get", "events", "-o", "wide", "--field-selector",
                         "involvedObject.name=repeated").stdout)
    assert table[0][-2:] == ["COUNT", "NAME"], table
    repeated = [r for r in table[1:] if "BackoffLimitExceeded" in r]
    assert len(repeated) == 1 and repeated[0][-2] == "3", table  # one row, COUNT 3
    assert len(table) == 3, table
    selector = "reason=BackoffLimitExceeded,involvedObject.name=repeated"
    name = json.loads(kubectl(kubeconfig, "get", "events", "--field-selector", selector, "-o", "json").stdout)[
        "items"][0]["metadata"]["name"]
    kubectl(kubeconfig, "delete", "event", name)
    kube.post_event(owner, "BackoffLimitExceeded", "pod repeated-0 failed", warning=True)
    again = json.loads(kubectl(kubeconfig, "get", "events", "--field-selector", selector, "-o", "json").stdout)["items"]
    assert [e["count"] for e in again] == [4] and again[0]["metadata"]["name"] != name


POLICY_REFUSALS = [  # (job, spec change, field the Failed condition names)
    ("priv", {"securityContext": {"privileged": True}}, "spec.securityContext.privileged: Forbidden"),
    ("caps", {"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}},
     "spec.securityContext.capabilities.add: Forbidden: this operator's policy denies adding SYS_ADMIN"),
    ("escalate", {"securityContext": {"allowPrivilegeEscalation": True}},
     "spec.securityContext.allowPrivilegeEscalation: Forbidden"),
    ("proc", {"securityContext": {"procMount": "Unmasked"}}, "spec.securityContext.procMount: Forbidden"),
    ("hostpath", {"volumes": [{"name": "drv", "hostPath": {"path": "/usr/local/Ascend"}}]},
     "spec.volumes[0] (drv): Forbidden: hostPath volumes are denied"),
    ("shadow", {"volumes": [{"name": "cfg", "emptyDir": {}}],
                "volumeMounts": [{"name": "cfg", "mountPath": "/etc/ascendtrain"}]},
     "spec.volumeMounts[0].mountPath: Forbidden: /etc/ascendtrain is over /etc/ascendtrain"),
]


def test_the_pod_policy_refuses_through_kubectl_and_torchrun_variables_win_over_env_from(kubeconfig, namespace,
                                                                                        tmp_path):
    """jobPodPolicy's defaults, applied with the real kubectl: each hostile job fails at once with the field named
    (kubectl get's FAILURE column, a Warning event), no pod is made; hostPID/hostIPC have no field, so the
    server refuses them; a ConfigMap's NODE_RANK or MASTER_ADDR through envFrom loses to the operator's env."""
    with open(tmp_path / "operator.log", "wb") as log:
        operator = subprocess.Popen(operator_command(namespace, "--standalone"), env=operator_env(kubeconfig),
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = job_named("base")
        base["spec"]["devices"] = {"resource": "huawei.com/Ascend910"}

        def job(name: str, change: dict) -> dict:
            return base | {"metadata": {"name": name}, "spec": copy.deepcopy(base["spec"]) | change}

        hostile = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "hostile"},
                   "data": {"NODE_RANK": "7", "MASTER_ADDR": "evil.example"}}
        documents = [hostile, job("envfrom", {"envFrom": [{"configMapRef": {"name": "hostile"}}]})] + [
            job(name, change) for name, change, _ in POLICY_REFUSALS]
        kubectl(kubeconfig, "apply", "-f", str(write(tmp_path, "policy.yaml", *documents)))
        hosts = write(tmp_path, "hosts.yaml", *[job(field.lower(), {field: True}) for field in ("hostPID", "hostIPC")])
        refused = kubectl(kubeconfig, "apply", "-f", str(hosts), check=False)
        assert refused.returncode != 0 and 'unknown field "spec.hostPID"' in refused.stderr \
            and 'unknown field "spec.hostIPC"' in refused.stderr, refused.stderr
        deadline = time.monotonic() + 60
        while True:
            table = kubectl(kubeconfig, "get", "atj", "-o", "wide").stdout
            pods = json.loads(kubectl(kubeconfig, "get", "pods", "-o", "json").stdout)["items"]
            if all(f" {field}" in table for _, _, field in POLICY_REFUSALS) and len(pods) == 2:
                break
            assert time.monotonic() < deadline, table
            time.sleep(0.5)
        events = kubectl(kubeconfig, "get", "events").stdout
        for name, _, field in POLICY_REFUSALS:
            row = next(line for line in table.splitlines() if line.startswith(name + " "))
            assert " Failed " in row and field in row, row
            assert re.search(rf"Warning\s+PolicyViolation\s+ascendtrainjob/{name}\s+.*{re.escape(field[:40])}",
                             events), events
        assert {p["metadata"]["labels"]["ascendtrain.dev/job-name"] for p in pods} == {"envfrom"}
        for pod in pods:
            container = pod["spec"]["containers"][0]
            env_vars = {e["name"]: e.get("value") for e in container["env"]}
            assert container["envFrom"] == [{"configMapRef": {"name": "hostile"}}]
            # A container's env wins over its envFrom (Kubernetes' rule), and the operator sets every variable of
            # torchrun's launcher in env; RANK is set by torchrun itself in each worker's environment.
            assert env_vars["MASTER_ADDR"] == f"envfrom-0.envfrom.{namespace}.svc", env_vars
            assert {"MASTER_PORT", "NNODES", "NODE_RANK", "NPROC_PER_NODE", "WORLD_SIZE"} <= set(env_vars), env_vars
    finally:
        operator.send_signal(signal.SIGTERM)
        operator.wait(30)
