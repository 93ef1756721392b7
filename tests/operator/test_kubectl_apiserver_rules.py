"""The local API server held to kube-apiserver's rules, seen through the real kubectl: built-in objects checked
against Kubernetes' own schemas and Pod rules, error causes that name the field once, the emulated version,
watches printed as tables, events with their times and counts."""
from __future__ import annotations

import copy
import datetime
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from ascend_cluster.cluster import OPERATOR_COMMAND, LocalCluster
from ascend_operator.local.core_schemas import KUBERNETES_VERSION
from test_kubectl import kubectl, pytestmark, rows  # noqa: F401 -- same binary, same skip conditions

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(root=tmp_path_factory.mktemp("rules") / "cluster") as local:
        yield local


def _apply(cluster, obj: dict, *flags: str) -> subprocess.CompletedProcess:
    path = cluster.root / f"{obj['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(obj))
    return kubectl(cluster, "apply", *flags, "-f", str(path), check=False)


def _pod(name: str, **spec) -> dict:
    container = {"name": "main", "image": "busybox", "command": ["true"]} | spec.pop("container", {})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"restartPolicy": "Never", "containers": [container]} | spec}


# (field, words) of each fault in one pod, which kube-apiserver reports all at once.
POD_FAULTS = [
    ("spec.tolerations[0].operator", "value must be empty when `operator` is 'Exists'"),
    ("spec.tolerations[1].key", "name part must consist of alphanumeric characters"),
    ("spec.tolerations[2].operator", 'Unsupported value: "In"'),
    ("spec.containers[0].image", "must not have leading or trailing whitespace"),
    ("spec.containers[0].ports[0].containerPort", "must be between 1 and 65535, inclusive"),
    # 1.32 (RelaxedEnvironmentVariableValidation): any printable ASCII but '='
    ("spec.containers[0].env[0].name", "must consist only of printable ASCII characters other than '='"),
    ("spec.volumes[0].emptyDir", "may not specify more than 1 volume type"),  # the second in Go's order
    ("spec.containers[1].name", "Required value"),
]


def test_kube_apiserver_pod_rules_refuse_a_bad_pod_naming_each_field_once(cluster):
    pod = _pod("faults", tolerations=[{"key": "a", "operator": "Exists", "value": "x"},
                                      {"key": "bad key", "operator": "Exists"}, {"key": "a", "operator": "In"}],
               volumes=[{"name": "v", "emptyDir": {}, "hostPath": {"path": "/x"}}],
               container={"image": "busybox\n", "ports": [{"containerPort": 70000}],
                          "env": [{"name": "A=B", "value": "v"}, {"name": "1 X", "value": "fine in 1.32"}]})
    pod["spec"]["containers"].append({"name": "", "image": "busybox"})
    result = _apply(cluster, pod)
    assert result.returncode != 0 and 'The Pod "faults" is invalid' in result.stderr, result.stderr
    for field, words in POD_FAULTS:
        assert f"{field}: " in result.stderr and words in result.stderr, (field, result.stderr)
        assert f"{field}: {field}" not in result.stderr  # the path once, as kube-apiserver's causes carry it
    assert "env[1]" not in result.stderr


def test_resources_ids_node_selector_and_env_from_are_checked_as_kube_apiserver_does(cluster):
    """The pod rules a job's template reaches through passthrough fields, all reported at once, each named."""
    pod = _pod("many-faults", nodeSelector={"zone": "z" * 64}, securityContext={"fsGroup": -1},
               container={"resources": {"requests": {"cpu": "4", "Bad Name": "1", "example.com/dev": "1"},
                                        "limits": {"cpu": "1", "example.com/dev": "2"}},
                          "securityContext": {"runAsUser": -1}, "env": [{"name": "1 X", "value": "fine in 1.32"}],
                          "envFrom": [{"prefix": "A="}]})
    result = _apply(cluster, pod)
    assert result.returncode != 0, "accepted"
    for words in ('spec.containers[0].resources.requests: Invalid value: "4": must be less than or equal to cpu '
                  "limit of 1",
                  'spec.containers[0].resources.requests[Bad Name]: Invalid value: "Bad Name": name part must',
                  'spec.containers[0].resources.requests: Invalid value: "1": must be equal to example.com/dev '
                  "limit of 2",
                  "spec.containers[0].securityContext.runAsUser: Invalid value: -1: must be between 0 and 2147483647",
                  "spec.securityContext.fsGroup: Invalid value: -1",
                  "spec.nodeSelector: Invalid value: \"" + "z" * 64 + '": must be no more than 63 characters',
                  "spec.containers[0].envFrom[0].prefix: Invalid value: \"A=\"",
                  "spec.containers[0].envFrom[0]: Invalid value: \"\": must specify one of: `configMapRef` or "
                  "`secretRef`"):
        assert words in result.stderr, result.stderr
    assert "env[0]" not in result.stderr


# (field, words) of faults in what a job's template passes through (affinity, volumes, mounts, env references,
# security contexts): kube-apiserver 1.32 refuses each of them; a scheduler or kubelet would never see the pod.
PASSTHROUGH_FAULTS = [
    ("spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
     ".matchExpressions[0].operator", 'Invalid value: "Equals": not a valid selector operator'),
    ("spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight",
     "Invalid value: 0: must be in the range 1-100"),
    ("spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey",
     "Required value: can not be empty"),
    ("spec.volumes[0].hostPath.type", 'Unsupported value: "Dir"'),
    ("spec.volumes[1].configMap.items[0].path", "Invalid value: \"../escape\": must not contain '..'"),
    ("spec.volumes[2].persistentVolumeClaim.claimName", "Required value"),
    ("spec.containers[0].volumeMounts.subPath", 'Invalid value: "/abs": must be a relative path'),
    ("spec.containers[0].volumeMounts[1].mountPropagation", "Forbidden: Bidirectional mount propagation is "
                                                            "available only to privileged containers"),
    ("spec.containers[0].env[0].valueFrom.fieldRef.fieldPath", 'Invalid value: "spec.bogus": error converting '
                                                               "fieldPath: field label not supported: spec.bogus"),
    ("spec.containers[0].env[1].valueFrom.secretKeyRef.key", 'Invalid value: "a/b": a valid config key'),
    ("spec.containers[0].envFrom[0].configMapRef.name", 'Invalid value: "Tuning_Values": a lowercase RFC 1123'),
    ("spec.containers[0].securityContext.seccompProfile.localhostProfile", "Required value: must be set when "
                                                                           "seccomp type is Localhost"),
    ("spec.containers[0].securityContext.procMount", 'Unsupported value: "Bogus"'),
    ("spec.securityContext.sysctls[1].name", 'Duplicate value: "kernel.shm_rmid_forced"'),
    ("spec.securityContext.fsGroupChangePolicy", 'Unsupported value: "Sometimes"'),
]


def test_what_a_job_passes_through_to_its_pods_is_held_to_kube_apiservers_pod_rules(cluster):
    pod = _pod("passthrough", affinity={
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "Equals", "values": ["a"]}]}]},
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 0, "preference": {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}}]},
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": ""}]}},
        volumes=[{"name": "host", "hostPath": {"path": "/data", "type": "Dir"}},
                 {"name": "cfg", "configMap": {"name": "cfg", "items": [{"key": "k", "path": "../escape"}]}},
                 {"name": "claim", "persistentVolumeClaim": {"claimName": ""}}],
        securityContext={"fsGroupChangePolicy": "Sometimes", "sysctls": [
            {"name": "kernel.shm_rmid_forced", "value": "1"}, {"name": "kernel.shm_rmid_forced", "value": "0"}]},
        container={"volumeMounts": [{"name": "cfg", "mountPath": "/cfg", "subPath": "/abs"},
                                    {"name": "host", "mountPath": "/host", "mountPropagation": "Bidirectional"}],
                   "env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.bogus"}}},
                           {"name": "B", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "a/b"}}}],
                   "envFrom": [{"configMapRef": {"name": "Tuning_Values"}}],
                   "securityContext": {"seccompProfile": {"type": "Localhost"}, "procMount": "Bogus"}})
    result = _apply(cluster, pod)
    assert result.returncode != 0 and 'The Pod "passthrough" is invalid' in result.stderr, result.stderr
    for field, words in PASSTHROUGH_FAULTS:
        assert f"{field}: {words}" in result.stderr, (field, result.stderr)
    sound = _pod("passthrough-ok", affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
        volumes=[{"name": "cfg", "configMap": {"name": "cfg", "items": [{"key": "k", "path": "conf/k"}]}}],
        container={"volumeMounts": [{"name": "cfg", "mountPath": "/cfg", "subPath": "conf", "readOnly": True,
                                     "recursiveReadOnly": "IfPossible"}],
                   "env": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                           {"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['team']"}}}],
                   "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}})
    result = _apply(cluster, sound, "--dry-run=server")
    assert result.returncode == 0, result.stderr


def test_configmaps_secrets_services_leases_and_metadata_are_held_to_kube_apiservers_rules(cluster):
    def create(obj: dict) -> subprocess.CompletedProcess:
        path = cluster.root / f"{obj['metadata']['name']}.json"
        path.write_text(json.dumps(obj))
        return kubectl(cluster, "create", "-f", str(path), check=False)

    def refused(obj: dict, *words: str) -> None:
        result = create(obj)
        assert result.returncode != 0 and all(w in result.stderr for w in words), (words, result.stderr)

    meta = {"namespace": "default"}
    refused({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "keys", **meta},
             "data": {"a/b": "1", "c": "2"}, "binaryData": {"c": "Mg=="}},
            'data[a/b]: Invalid value: "a/b": a valid config key must consist of alphanumeric characters',
            'data[c]: Invalid value: "c": duplicate of key present in binaryData')
    refused({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "over-a-mib", **meta},
             "data": {"a": "x" * (1024 * 1024), "b": "y"}}, ": Too long: must have at most 1048576 bytes")
    refused({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "over-a-mib", **meta},
             "stringData": {"a": "x" * (1024 * 1024 + 1)}}, "data: Too long: must have at most 1048576 bytes")
    # Past kube-apiserver's request limit (3 MiB) the body is not even read: 413, not a dropped connection or a 500.
    refused({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "over-three", **meta},
             "data": {"a": "x" * (3 * 1024 * 1024)}},
            "(RequestEntityTooLarge)", "Request entity too large: limit is 3145728")
    refused({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "owned", "finalizers": ["bad finalizer"],
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": ""}], **meta}},
        'metadata.ownerReferences.uid: Invalid value: "": uid must not be empty',
        'metadata.finalizers: Invalid value: "bad finalizer": name part must consist of')
    refused({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "port-zero", **meta},
             "spec": {"ports": [{"port": 0}]}},
            "spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive")
    refused({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "never", **meta},
             "spec": {"leaseDurationSeconds": 0}},
            "spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0")
    # Just under the limits is a ConfigMap kube-apiserver stores (aiohttp's default would have refused its body).
    assert create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a-mib", **meta},
                   "data": {"a": "x" * (1024 * 1024 - 8)}}).returncode == 0


def test_built_in_objects_take_strategic_merge_patches_and_custom_resources_refuse_them(cluster):
    """kubectl apply and kubectl patch send strategic merge patches for built-in kinds: a Service's ports merge by
    port, as on kube-apiserver (a JSON merge patch would have replaced the list); a custom resource answers 415."""
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "merged", "namespace": "default"},
               "spec": {"selector": {"app": "x"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080},
                                                            {"name": "metrics", "port": 9400}]}}
    assert _apply(cluster, service).returncode == 0
    service["spec"]["ports"][0]["targetPort"] = 8081
    applied = _apply(cluster, service)
    assert applied.returncode == 0 and "configured" in applied.stdout, applied.stderr

    def ports() -> list:
        return json.loads(kubectl(cluster, "get", "svc", "merged", "-o", "json").stdout)["spec"]["ports"]

    assert [(p["name"], p["port"], p.get("targetPort")) for p in ports()] == [("http", 80, 8081),
                                                                              ("metrics", 9400, None)]
    kubectl(cluster, "patch", "svc", "merged", "-p", '{"spec": {"ports": [{"name": "debug", "port": 5678}]}}')
    assert [p["port"] for p in ports()] == [80, 9400, 5678]
    kubectl(cluster, "patch", "svc", "merged", "-p", '{"spec": {"ports": [{"port": 5678, "$patch": "delete"}]}}')
    assert [p["port"] for p in ports()] == [80, 9400]
    duplicate = kubectl(cluster, "patch", "svc", "merged", "-p", '{"spec": {"ports": [{"name": "http", "port": 81}]}}',
                        check=False)
    assert duplicate.returncode != 0 and 'spec.ports[2].name: Duplicate value: "http"' in duplicate.stderr
    job = copy.deepcopy(yaml.safe_load(QUICKSTART.read_text()))
    job["metadata"]["name"] = "no-strategic"
    assert _apply(cluster, job).returncode == 0
    refused = kubectl(cluster, "patch", "atj", "no-strategic", "-p", '{"spec": {"runPolicy": {"backoffLimit": 2}}}',
                      check=False)
    assert refused.returncode != 0 and "application/merge-patch+json" in refused.stderr, refused.stderr


def test_requests_are_authenticated_and_held_to_rbac_as_the_operators_chart_grants(cluster):
    """The operator's kubeconfig carries its ServiceAccount's token, bound to exactly the chart's rules: what the
    chart grants works, anything else is kube-apiserver's 403 naming user, verb and resource; a token nobody issued
    is 401. (kubectl sends no token over plain HTTP: a request without one is served as the insecure port was.)"""
    token = yaml.safe_load(cluster.operator_kubeconfig().read_text())["users"][0]["user"]["token"]

    def ask(path: str, method: str = "GET", bearer: str = token) -> tuple[int, str]:
        request = urllib.request.Request(cluster.api_server.url + path, method=method,
                                         headers={"Authorization": f"Bearer {bearer}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, ""
        except urllib.error.HTTPError as refused:
            return refused.code, json.loads(refused.read())["message"]

    assert ask("/apis/ascendtrain.dev/v1alpha1/ascendtrainjobs") == (200, "")
    assert ask("/api/v1/namespaces/default/pods?watch=true&timeoutSeconds=1")[0] == 200
    assert ask("/api/v1/namespaces/default/secrets") == (403, (
        'secrets is forbidden: User "system:serviceaccount:default:ascend-train-operator" cannot list resource '
        '"secrets" in API group "" in the namespace "default"'))
    assert ask("/api/v1/namespaces/default/configmaps/x", "DELETE") == (403, (
        'configmaps "x" is forbidden: User "system:serviceaccount:default:ascend-train-operator" cannot delete '
        'resource "configmaps" in API group "" in the namespace "default"'))
    # Its Role grants the leader-election Lease in its own namespace only.
    assert ask("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/x")[0] == 403
    assert ask("/apis/coordination.k8s.io/v1/namespaces/default/leases/x")[0] == 404
    assert ask("/apis/ascendtrain.dev/v1alpha1/ascendtrainjobs", bearer="nobody-issued-this") == (401, "Unauthorized")
    assert ask("/api/v1/namespaces/default/secrets", bearer="local")[0] == 200  # the admin's kubeconfig


def test_pods_are_admitted_as_the_service_account_and_priority_plugins_admit_them(cluster):
    """Every namespace has its default account; a pod names an account and a priority class that exist, and
    gets its priority from the class."""
    kubectl(cluster, "create", "namespace", "team-b")
    assert kubectl(cluster, "get", "serviceaccount", "default", "-n", "team-b", "-o", "name").stdout.strip() == \
        "serviceaccount/default"
    assert {"system-cluster-critical", "system-node-critical"} <= \
        set(kubectl(cluster, "get", "priorityclasses", "-o", "name").stdout.replace("priorityclass.scheduling.k8s.io/",
                                                                                    "").split())
    for pod, words in ((_pod("ghost-sa", serviceAccountName="ghost"), 'Error from server (Forbidden): error when '
                        'creating "{path}": pods "ghost-sa" is forbidden: error looking up service account '
                        'default/ghost: serviceaccount "ghost" not found'),
                       (_pod("ghost-pc", priorityClassName="ghost"),
                        'pods "ghost-pc" is forbidden: no PriorityClass with name ghost was found'),
                       (_pod("own-priority", priority=5), 'the integer value of priority (5) must not be provided in '
                                                          "pod spec; priority admission controller computed 0")):
        result = _apply(cluster, pod)
        path = cluster.root / f"{pod['metadata']['name']}.yaml"
        assert result.returncode != 0 and words.format(path=path) in result.stderr, result.stderr
    kubectl(cluster, "create", "priorityclass", "research", "--value", "1000")
    assert _apply(cluster, _pod("admitted", priorityClassName="research")).returncode == 0
    spec = json.loads(kubectl(cluster, "get", "pod", "admitted", "-o", "json").stdout)["spec"]
    assert (spec["serviceAccountName"], spec["priority"], spec["preemptionPolicy"]) == \
        ("default", 1000, "PreemptLowerPriority")


def test_unknown_pod_fields_are_refused_under_strict_and_dropped_with_a_warning_otherwise(cluster):
    pod = _pod("unknown-field", tolerations=[{"key": "a", "operator": "Exists", "tolerationSecond": 5}])
    strict = _apply(cluster, pod)  # kubectl's default is fieldValidation=Strict
    assert strict.returncode != 0 and 'unknown field "spec.tolerations[0].tolerationSecond"' in strict.stderr, \
        strict.stderr
    warned = _apply(cluster, pod, "--validate=warn")
    assert warned.returncode == 0 and 'unknown field "spec.tolerations[0].tolerationSecond"' in warned.stderr
    stored = json.loads(kubectl(cluster, "get", "pod", "unknown-field", "-o", "json").stdout)
    assert stored["spec"]["tolerations"] == [{"key": "a", "operator": "Exists"}]


def test_a_custom_objects_metadata_is_decoded_as_object_meta(cluster):
    """An unknown field in a custom object's metadata was stored as written, also under Strict."""
    job = copy.deepcopy(yaml.safe_load(QUICKSTART.read_text()))
    job["metadata"] |= {"name": "meta-typo", "label": {"team": "a"}}
    strict = _apply(cluster, job)
    assert strict.returncode != 0 and 'strict decoding error: unknown field "metadata.label"' in strict.stderr, \
        strict.stderr
    job["spec"]["runPolicy"] = {"suspend": True}
    warned = _apply(cluster, job, "--validate=warn")
    assert warned.returncode == 0 and 'unknown field "metadata.label"' in warned.stderr, warned.stderr
    stored = json.loads(kubectl(cluster, "get", "atj", "meta-typo", "-o", "json").stdout)
    assert "label" not in stored["metadata"]
    typed = kubectl(cluster, "patch", "atj", "meta-typo", "--type=merge", "-p", '{"metadata": {"labels": "a"}}',
                    check=False)
    assert typed.returncode != 0 and ("cannot be handled as a AscendTrainJob: json: cannot unmarshal string into Go "
                                      "struct field metadata.labels of type object") in typed.stderr, typed.stderr


def test_a_value_of_the_wrong_type_fails_decoding_as_on_kube_apiserver(cluster):
    result = _apply(cluster, _pod("typed", container={"ports": [{"containerPort": "http"}]}))
    assert result.returncode != 0 and 'cannot be handled as a Pod' in result.stderr, result.stderr
    result = _apply(cluster, _pod("quantity", volumes=[{"name": "shm", "emptyDir": {"sizeLimit": "16Gigs"}}]))
    assert result.returncode != 0 and 'cannot be handled as a Pod: quantities must match the regular expression' \
        in result.stderr, result.stderr


def test_custom_resource_errors_name_the_field_once(cluster):
    job = copy.deepcopy(yaml.safe_load(QUICKSTART.read_text()))
    job["metadata"]["name"] = "bad-stage"
    job["spec"]["train"]["stage"] = "rlhf"
    result = _apply(cluster, job)
    assert result.returncode != 0 and "spec.train.stage: Unsupported value" in result.stderr, result.stderr
    assert "spec.train.stage: spec.train.stage" not in result.stderr and "<nil>: <nil>" not in result.stderr


def test_the_server_reports_the_kubernetes_version_it_emulates(cluster):
    server = json.loads(kubectl(cluster, "version", "-o", "json").stdout)["serverVersion"]
    assert server["gitVersion"] == f"v{KUBERNETES_VERSION}"
    assert (server["major"], server["minor"]) == tuple(KUBERNETES_VERSION.split(".")[:2])


def _watch_output(cluster, *args: str, seconds: float) -> list[list[str]]:
    """What `kubectl get ... -w` printed within ``seconds`` (a watch never ends by itself)."""
    env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig), HOME=str(cluster.root))
    try:
        subprocess.run(["kubectl", "get", *args, "-w"], env=env, capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired as stopped:
        return [line.split() for line in (stopped.stdout or b"").decode().splitlines()]
    raise AssertionError("the watch ended by itself")


def test_get_watch_prints_the_header_before_the_first_row(cluster):
    job = copy.deepcopy(yaml.safe_load(QUICKSTART.read_text()))
    job["metadata"]["name"] = "watched"
    assert _apply(cluster, job).returncode == 0
    job["spec"].setdefault("runPolicy", {})["backoffLimit"] = 7  # runPolicy is the part a job may change
    later = threading.Timer(1.5, lambda: _apply(cluster, job))  # a change while watching: one more row
    later.start()
    try:
        lines = _watch_output(cluster, "atj", "watched", seconds=4)
    finally:
        later.join()
    assert lines[0][:3] == ["NAME", "PHASE", "ITER"], lines
    assert [line[0] for line in lines[1:]] == ["watched", "watched"], lines  # rows only, no header repeated


def test_get_events_shows_last_seen_first_seen_and_count(cluster):
    resources = cluster.client()
    ago = lambda s: (datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=s))  # noqa: E731
    resources.apply({  # as kopf and client-go's recorder write them: microseconds, a count that grew
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": "seen.1", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": "seen", "namespace": "default"}, "reason": "BackOff",
        "message": "restarting", "type": "Warning", "count": 3, "source": {"component": "kubelet"},
        "firstTimestamp": ago(300).isoformat().replace("+00:00", "Z"),
        "lastTimestamp": ago(30).strftime("%Y-%m-%dT%H:%M:%SZ")})
    resources.close()
    table = rows(kubectl(cluster, "get", "events", "-o", "wide", "--field-selector", "involvedObject.name=seen").stdout)
    assert table[0][:2] == ["LAST", "SEEN"]
    row = table[1]
    assert row[0].endswith("s") and 30 <= int(row[0][:-1]) < 90 and "<unknown>" not in row, row  # slow machines
    assert any(c.startswith("5m") for c in row) and "3" in row, row  # FIRST SEEN (5m, 5m1s a second on) and COUNT


def test_merge_patch_null_removes_then_defaults_and_new_crd_defaults_show_on_read(cluster):
    job = copy.deepcopy(yaml.safe_load(QUICKSTART.read_text()))
    job["metadata"]["name"] = "defaulted"
    assert _apply(cluster, job).returncode == 0
    kubectl(cluster, "patch", "atj", "defaulted", "--type", "merge", "-p", '{"spec": {"runPolicy": {"backoffLimit": 9}}}')
    assert json.loads(kubectl(cluster, "get", "atj", "defaulted", "-o", "json").stdout)["spec"]["runPolicy"][
        "backoffLimit"] == 9
    kubectl(cluster, "patch", "atj", "defaulted", "--type", "merge", "-p",
            '{"spec": {"runPolicy": {"backoffLimit": null}}}')
    stored = json.loads(kubectl(cluster, "get", "atj", "defaulted", "-o", "json").stdout)
    assert stored["spec"]["runPolicy"]["backoffLimit"] == 3  # null means "remove"; the server then applies the default
    crd = json.loads(kubectl(cluster, "get", "crd", "ascendtrainjobs.ascendtrain.dev", "-o", "json").stdout)
    spec_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec_schema["properties"]["note"] = {"type": "string", "default": "added later"}
    path = cluster.root / "crd.json"
    path.write_text(json.dumps(crd))
    kubectl(cluster, "replace", "-f", str(path))
    again = json.loads(kubectl(cluster, "get", "atj", "defaulted", "-o", "json").stdout)
    assert again["spec"]["note"] == "added later"  # defaulted on read, as from etcd
    assert again["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]  # without a write


def _events_of(cluster, pod: str, want: set[str], timeout: float = 30) -> str:
    """`kubectl describe pod`'s output once its Events list every reason in ``want``."""
    deadline = time.monotonic() + timeout
    while True:
        text = kubectl(cluster, "describe", "pod", pod).stdout
        events = text.split("Events:", 1)[-1]
        if all(reason in events for reason in want) or time.monotonic() > deadline:
            return events
        time.sleep(0.3)


def test_the_local_node_posts_the_pod_lifecycle_events_kubelet_and_scheduler_post(cluster):
    code = "import time; time.sleep(30)"
    sleeper = _pod("sleeper", container={"image": "local", "command": ["python", "-c", code]})
    assert _apply(cluster, sleeper).returncode == 0, "the sleeper was refused"
    events = _events_of(cluster, "sleeper", {"Scheduled", "Pulled", "Created", "Started"})
    for reason, source in (("Scheduled", "default-scheduler"), ("Pulled", "kubelet"), ("Created", "kubelet"),
                           ("Started", "kubelet")):
        assert re.search(rf"Normal\s+{reason}\s+\S+\s+{source}", events), events
    order = [re.search(rf"Normal\s+{reason}\s", events).start() for reason in ("Scheduled", "Pulled", "Created", "Started")]
    assert order == sorted(order), events  # in the order they happened, as describe lists a kubelet's
    kubectl(cluster, "delete", "pod", "sleeper", "--wait=false")
    deadline = time.monotonic() + 20
    while "Killing" not in (seen := kubectl(cluster, "get", "events", "--field-selector",
                                            "involvedObject.name=sleeper").stdout):
        assert time.monotonic() < deadline, seen
        time.sleep(0.3)
    assert re.search(r"Normal\s+Killing\s+pod/sleeper\s+Stopping container main", seen), seen
    greedy = _pod("greedy", container={"image": "local", "resources": {"limits": {"huawei.com/Ascend910": "1"}}})
    assert _apply(cluster, greedy).returncode == 0
    events = _events_of(cluster, "greedy", {"FailedScheduling"})
    assert re.search(r"Warning\s+FailedScheduling\s+.*0/1 nodes are available: 1 Insufficient huawei.com/Ascend910",
                     events), events


def test_the_operators_repeated_events_are_one_event_with_a_count(cluster, monkeypatch):
    """As client-go's recorder: a repeat bumps count and LAST SEEN of the first Event; a deleted one is made anew."""
    from kubernetes.config import kube_config
    from ascend_operator.kubeclient import Kube
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(cluster.kubeconfig))
    kube = Kube()
    owner = kube._json("POST", "/api/v1/namespaces/default/configmaps", {  # any object with a uid
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "repeated", "namespace": "default"}})
    for _ in range(3):
        kube.post_event(owner, "BackoffLimitExceeded", "pod repeated-0 failed", warning=True)
    kube.post_event(owner, "Restarting", "another reason, another event")
    table = rows(kubectl(cluster, "get", "events", "-o", "wide", "--field-selector",
                         "involvedObject.name=repeated").stdout)
    assert table[0][-2:] == ["COUNT", "NAME"], table
    repeated = [r for r in table[1:] if "BackoffLimitExceeded" in r]
    assert len(repeated) == 1 and repeated[0][-2] == "3", table  # one row, COUNT 3
    assert len(table) == 3, table
    name = json.loads(kubectl(cluster, "get", "events", "--field-selector",
                              "reason=BackoffLimitExceeded,involvedObject.name=repeated", "-o", "json").stdout)[
        "items"][0]["metadata"]["name"]
    kubectl(cluster, "delete", "event", name)
    kube.post_event(owner, "BackoffLimitExceeded", "pod repeated-0 failed", warning=True)
    again = json.loads(kubectl(cluster, "get", "events", "--field-selector",
                               "reason=BackoffLimitExceeded,involvedObject.name=repeated", "-o", "json").stdout)["items"]
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


def test_the_pod_policy_refuses_through_kubectl_and_torchrun_variables_win_over_env_from(cluster):
    """jobPodPolicy's defaults, applied with the real kubectl: each hostile job fails at once with the field named
    (kubectl get's FAILURE column, a Warning event), no pod is made; hostPID/hostIPC have no field, so the
    server refuses them; a ConfigMap's NODE_RANK or MASTER_ADDR through envFrom loses to the operator's env."""
    namespace = "policy"
    crd = Path(__file__).resolve().parents[2] / "crds" / "ascendtrainjobs.ascendtrain.dev.yaml"
    kubectl(cluster, "replace", "-f", str(crd))  # as generated: an earlier test of this module added a field
    kubectl(cluster, "create", "namespace", namespace)
    env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig), ASCEND_OPERATOR_METRICS_PORT="0",
               ASCEND_OPERATOR_DASHBOARD_PORT="0")
    with open(cluster.root / "policy-operator.log", "wb") as log:
        operator = subprocess.Popen([*OPERATOR_COMMAND[:4], "--namespace", namespace, "--standalone"], env=env,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = yaml.safe_load(QUICKSTART.read_text())
        base["spec"]["devices"] = {"resource": "huawei.com/Ascend910"}  # pods stay Pending: none run here
        job = lambda name, change: base | {"metadata": {"name": name, "namespace": namespace},  # noqa: E731
                                           "spec": copy.deepcopy(base["spec"]) | change}
        hostile = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "hostile", "namespace": namespace},
                   "data": {"NODE_RANK": "7", "MASTER_ADDR": "evil.example"}}
        documents = [hostile, job("envfrom", {"envFrom": [{"configMapRef": {"name": "hostile"}}]})] + [
            job(name, change) for name, change, _ in POLICY_REFUSALS]
        path = cluster.root / "policy.yaml"
        path.write_text(yaml.safe_dump_all(documents))
        kubectl(cluster, "apply", "-f", str(path))
        path.write_text(yaml.safe_dump_all([job(field.lower(), {field: True}) for field in ("hostPID", "hostIPC")]))
        refused = kubectl(cluster, "apply", "-f", str(path), check=False)
        assert refused.returncode != 0 and 'unknown field "spec.hostPID"' in refused.stderr \
            and 'unknown field "spec.hostIPC"' in refused.stderr, refused.stderr
        deadline = time.monotonic() + 60
        while True:
            table = kubectl(cluster, "get", "atj", "-n", namespace, "-o", "wide").stdout
            pods = json.loads(kubectl(cluster, "get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
            if all(f" {field}" in table for _, _, field in POLICY_REFUSALS) and len(pods) == 2:
                break
            assert time.monotonic() < deadline, table
            time.sleep(0.5)
        events = kubectl(cluster, "get", "events", "-n", namespace).stdout
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
            assert env_vars["MASTER_ADDR"].startswith("envfrom-0.envfrom."), env_vars
            assert {"MASTER_PORT", "NNODES", "NODE_RANK", "NPROC_PER_NODE", "WORLD_SIZE"} <= set(env_vars), env_vars
    finally:
        os.killpg(operator.pid, signal.SIGTERM)
        operator.wait(30)
