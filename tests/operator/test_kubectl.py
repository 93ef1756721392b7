"""The real ``kubectl`` binary against the local cluster: what a user types after `ascend-train local up`.

Skipped only when no kubectl can be found (the Makefile's set-up installs Debian's package when missing).
"""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from ascend_operator.api.train_job import TrainProgress
from ascend_train.cli import main as ascend_train
from ascend_operator.local import protobuf_codec
from ascend_cluster.cluster import LocalCluster



def _kubectl_minor() -> int | None:
    """kubectl's client minor version, None without a kubectl."""
    if shutil.which("kubectl") is None:
        return None
    out = subprocess.run(["kubectl", "version", "--client", "-o", "json"], capture_output=True, text=True)
    try:
        return int(re.match(r"\d+", json.loads(out.stdout)["clientVersion"]["minor"]).group(0))
    except (ValueError, KeyError, AttributeError):
        return 0


MINOR = _kubectl_minor()
pytestmark = [pytest.mark.operator,
              pytest.mark.skipif(MINOR is None, reason="kubectl is not installed (`make tools` installs it)"),
              pytest.mark.skipif(MINOR is not None and MINOR < 27,
                                 reason=f"kubectl 1.{MINOR} predates OpenAPI v3 (1.27+), which the local API serves")]

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(root=tmp_path_factory.mktemp("kubectl") / "cluster") as local:
        yield local


def kubectl(cluster: LocalCluster, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig), HOME=str(cluster.root))
    result = subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    return result


def rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


def wait_phase(resources, pods, name: str, phases: tuple[str, ...], timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        pod = resources.get(pods, name, "default")
        if (pod.get("status") or {}).get("phase") in phases:
            return pod
        assert time.monotonic() < deadline, pod.get("status")
        time.sleep(0.1)


def test_get_atj_shows_the_crd_printer_columns(cluster):
    resources = cluster.client()
    atj = resources.resolve("atj")
    job = copy.deepcopy(yaml.safe_load(QUICKSTART.read_text()))
    job["metadata"]["name"] = "columns"
    resources.apply(job)
    raw = {"iteration": 12, "loss": 1.5500773191452026, "tokensPerSecond": 812.6}
    progress = TrainProgress.with_columns(raw)  # what the operator writes
    resources.request("PATCH", atj.path("default", "columns", "status"), {"status": {
        "phase": "Running", "restarts": 1, "progress": progress, "evaluation": {"summary": "mmlu=0.2500"}}},
        content_type="application/merge-patch+json")
    resources.close()
    table = rows(kubectl(cluster, "get", "atj").stdout)
    assert table[0] == ["NAME", "PHASE", "ITER", "LOSS", "TOK/S", "EVAL", "RESTARTS", "AGE"]
    assert table[1][:7] == ["columns", "Running", "12", "1.550", "813", "mmlu=0.2500", "1"]  # for humans
    stored = json.loads(kubectl(cluster, "get", "atj", "columns", "-o", "json").stdout)["status"]["progress"]
    assert {k: stored[k] for k in raw} == raw  # the raw figures stay in status
    assert table[1][7].endswith("s")  # an age computed by kubectl from the date column


def test_ascend_train_get_says_why_a_job_failed(cluster, capsys):
    resources = cluster.client()
    atj = resources.resolve("atj")
    job = copy.deepcopy(yaml.safe_load(QUICKSTART.read_text()))
    job["metadata"]["name"] = "broken"
    resources.apply(job)
    cause = "pod broken-0 failed: exit code 1 (Error): FileNotFoundError: config.json missing in /models/x"
    resources.request("PATCH", atj.path("default", "broken", "status"), {"status": {"phase": "Failed", "conditions": [
        {"type": "Failed", "status": "True", "reason": "PodFailed", "message": cause,
         "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}, content_type="application/merge-patch+json")
    resources.close()
    assert ascend_train(["--root", str(cluster.root), "get", "atj"]) == 0
    assert f"broken failed: {cause}" in capsys.readouterr().out.splitlines()


def test_get_pods_ready_status_restarts_and_logs(cluster):
    resources = cluster.client()
    pods = resources.resolve("pods")
    code = "import time\nfor i in range(3):\n    print('line', i, flush=True); time.sleep(0.3)\n"
    resources.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "talker", "namespace": "default"},
                     "spec": {"restartPolicy": "Never", "containers": [
                         {"name": "main", "image": "local", "command": ["python", "-c", code]}]}})
    wait_phase(resources, pods, "talker", ("Running", "Succeeded"))
    followed = kubectl(cluster, "logs", "-f", "talker")  # returns once the container has finished
    assert followed.stdout.splitlines() == ["line 0", "line 1", "line 2"]
    wait_phase(resources, pods, "talker", ("Succeeded",))
    resources.close()
    assert kubectl(cluster, "logs", "talker", "--tail=1").stdout == "line 2\n"
    table = rows(kubectl(cluster, "get", "pods").stdout)
    assert table[0] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert ["talker", "0/1", "Completed", "0"] == next(r for r in table if r[0] == "talker")[:4]
    missing = kubectl(cluster, "logs", "nobody", check=False)
    assert missing.returncode != 0 and 'pods "nobody" not found' in missing.stderr


def test_logs_show_container_paths(cluster, capsys):
    """The runner starts the process with host paths; what it prints reads as on a cluster: kubectl logs (with
    and without -f), ascend-train logs and the termination message all say /workspace, never the claim's
    directory on this machine."""
    resources = cluster.client()
    pods = resources.resolve("pods")
    code = ("import os, sys, time\nprint('cwd', os.getcwd(), flush=True)\nsys.stdout.write('saved to ')\n"
            "sys.stdout.flush(); time.sleep(0.5)\nprint(os.environ['CKPT'] + '/iter_0000010', flush=True)\n"
            "open('/dev/termination-log', 'w').write('missing ' + os.environ['CKPT'] + '/config.json')\n"
            "sys.exit(3)\n")
    resources.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "paths", "namespace": "default"},
                     "spec": {"restartPolicy": "Never",
                              "volumes": [{"name": "work", "persistentVolumeClaim": {"claimName": "work"}}],
                              "containers": [{"name": "main", "image": "local", "command": ["python", "-c", code],
                                              "workingDir": "/workspace",
                                              "env": [{"name": "CKPT", "value": "/workspace/ckpt"}],
                                              "volumeMounts": [{"name": "work", "mountPath": "/workspace"}]}]}})
    wait_phase(resources, pods, "paths", ("Running", "Failed"))
    expected = ["cwd /workspace", "saved to /workspace/ckpt/iter_0000010"]
    assert kubectl(cluster, "logs", "-f", "paths").stdout.splitlines() == expected
    failed = wait_phase(resources, pods, "paths", ("Failed",))
    resources.close()
    assert kubectl(cluster, "logs", "paths").stdout.splitlines() == expected
    terminated = failed["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["message"] == "missing /workspace/ckpt/config.json"
    assert ascend_train(["--root", str(cluster.root), "logs", "paths"]) == 0
    assert capsys.readouterr().out.splitlines() == expected
    raw = (cluster.root / "pods" / "default" / "paths" / "container.log").read_text()
    assert str(cluster.root / "pvc" / "default" / "work") in raw  # the process itself ran on the host's paths


def test_get_events_shows_reason_object_and_message(cluster):
    resources = cluster.client()
    resources.apply({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "talker.17a2b3c4d5e6f7", "namespace": "default"},
                     "involvedObject": {"kind": "AscendTrainJob", "name": "columns", "namespace": "default"},
                     "reason": "PodFailed", "message": "config.json missing in /models/x", "type": "Warning",
                     "count": 1, "source": {"component": "ascend-operator"}})
    resources.close()
    table = rows(kubectl(cluster, "get", "events", "--field-selector", "involvedObject.name=columns").stdout)
    assert table[0] == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert table[1][1:] == ["Warning", "PodFailed", "ascendtrainjob/columns", "config.json", "missing", "in",
                            "/models/x"]


def test_protobuf_requests_create_namespace_configmap_and_drain(cluster):
    """kubectl's typed requests carry protobuf bodies (the server decodes them with Kubernetes' own .proto types);
    drain evicts through pods/eviction, the pod marked DisruptionTarget before it goes."""
    sent = kubectl(cluster, "create", "namespace", "proto", "-v=8").stderr
    assert "Content-Type: application/vnd.kubernetes.protobuf" in sent
    kubectl(cluster, "create", "configmap", "settings", "-n", "proto", "--from-literal=lr=1e-4",
            "--from-literal=note=a b")
    kubectl(cluster, "create", "secret", "generic", "token", "-n", "proto", "--from-literal=key=s3cr3t")
    stored = json.loads(kubectl(cluster, "get", "configmap", "settings", "-n", "proto", "-o", "json").stdout)
    assert stored["data"] == {"lr": "1e-4", "note": "a b"} and stored["metadata"]["namespace"] == "proto"
    secret = kubectl(cluster, "get", "secret", "token", "-n", "proto", "-o", "jsonpath={.data.key}").stdout
    assert secret == "czNjcjN0"  # base64 of s3cr3t, bytes through protobuf
    # A client that accepts only protobuf gets it (protoc reads the envelope); custom resources have none: 406.
    ask = lambda path: urllib.request.urlopen(urllib.request.Request(  # noqa: E731
        cluster.api_server.url + path, headers={"Accept": "application/vnd.kubernetes.protobuf"}))
    answer = ask("/api/v1/namespaces/proto/configmaps/settings").read()
    assert answer[:4] == b"k8s\x00"
    envelope = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{protobuf_codec.PROTO_ROOT}",
                               "--decode=k8s.io.apimachinery.pkg.runtime.Unknown",
                               "k8s.io/apimachinery/pkg/runtime/generated.proto"],
                              input=answer[4:], capture_output=True, check=True).stdout.decode()
    assert 'apiVersion: "v1"' in envelope and 'kind: "ConfigMap"' in envelope and "1e-4" in envelope
    with pytest.raises(urllib.error.HTTPError) as refused:
        ask("/apis/ascendtrain.dev/v1alpha1/namespaces/proto/ascendtrainjobs")
    assert refused.value.code == 406
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "drained", "namespace": "proto",
                                                          "labels": {"drain": "me"}},
           "spec": {"terminationGracePeriodSeconds": 2,
                    "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "60"]}]}}
    resources = cluster.client()
    try:
        resources.apply(pod)
        pods, deadline = resources.resolve("pods"), time.monotonic() + 30
        while not (resources.get(pods, "drained", "proto").get("spec") or {}).get("nodeName"):  # on the node
            assert time.monotonic() < deadline
            time.sleep(0.05)
        watch = subprocess.Popen(["kubectl", "get", "pod", "drained", "-n", "proto", "-w", "-o", "json"],
                                 env=dict(os.environ, KUBECONFIG=str(cluster.kubeconfig)), stdout=subprocess.PIPE,
                                 text=True)
        first = ""
        while not first.endswith("\n}\n"):  # the pod as it is, printed before drain starts: no race
            line = watch.stdout.readline()
            assert line, f"kubectl get -w ended before printing the pod: {first!r}"
            first += line
        assert '"name": "drained"' in first
        drained = kubectl(cluster, "drain", "local", "--pod-selector=drain=me", "--force", "--timeout=20s", "-v=8")
        watch.terminate()
        seen = first + watch.communicate(timeout=10)[0]
    finally:
        kubectl(cluster, "uncordon", "local")
        resources.close()
    assert "/api/v1/namespaces/proto/pods/drained/eviction" in drained.stderr and "201 Created" in drained.stderr
    assert "pod/drained evicted" in drained.stdout
    assert '"reason": "EvictionByEvictionAPI"' in seen and '"type": "DisruptionTarget"' in seen
    assert kubectl(cluster, "get", "pod", "drained", "-n", "proto", check=False).returncode != 0


def test_apply_server_dry_run_validates_without_storing(cluster):
    job = copy.deepcopy(yaml.safe_load(QUICKSTART.read_text()))
    job["metadata"]["name"] = "dry"
    path = cluster.root / "dry.yaml"
    path.write_text(yaml.safe_dump(job))
    out = kubectl(cluster, "apply", "--dry-run=server", "-f", str(path))
    assert "ascendtrainjob.ascendtrain.dev/dry created (server dry run)" in out.stdout
    assert kubectl(cluster, "get", "atj", "dry", check=False).returncode != 0  # nothing was stored
    job["spec"]["train"]["parallel"]["tensorModelParallelSize"] = 3  # 2 pods x 1 device cannot hold TP=3
    path.write_text(yaml.safe_dump(job))
    bad = kubectl(cluster, "apply", "--dry-run=server", "-f", str(path), check=False)
    assert bad.returncode != 0 and "is invalid" in bad.stderr


def test_reapply_changes_run_policy_and_refuses_other_spec_changes(cluster):
    """The spec is immutable but for runPolicy (as a Job's template): never `configured` while nothing runs it."""
    job = copy.deepcopy(yaml.safe_load(QUICKSTART.read_text()))
    job["metadata"]["name"] = "applied"
    path = cluster.root / "applied.yaml"
    path.write_text(yaml.safe_dump(job))
    assert "ascendtrainjob.ascendtrain.dev/applied created" in kubectl(cluster, "apply", "-f", str(path)).stdout
    job["spec"]["runPolicy"] = {"backoffLimit": 1, "suspend": True}
    path.write_text(yaml.safe_dump(job))
    assert "ascendtrainjob.ascendtrain.dev/applied configured" in kubectl(cluster, "apply", "-f", str(path)).stdout
    job["spec"]["train"]["training"]["trainIters"] = 7
    job["spec"]["tolerations"] = [{"key": "npu", "operator": "Exists"}]  # a field the stored spec lacks
    path.write_text(yaml.safe_dump(job))
    refused = kubectl(cluster, "apply", "-f", str(path), check=False)
    assert refused.returncode != 0 and "configured" not in refused.stdout
    for field in ("spec.train", "spec.tolerations"):
        assert f"{field}: Forbidden: may not change once the job exists (only spec.runPolicy may)" in refused.stderr
    assert "kubectl replace --force -f FILE" in refused.stderr
    stored = yaml.safe_load(kubectl(cluster, "get", "atj", "applied", "-o", "yaml").stdout)
    assert stored["spec"]["train"]["training"]["trainIters"] == 30 and stored["spec"]["runPolicy"]["backoffLimit"] == 1
    kubectl(cluster, "replace", "--force", "-f", str(path))  # how to rerun: a new object with the new spec
    stored = yaml.safe_load(kubectl(cluster, "get", "atj", "applied", "-o", "yaml").stdout)
    assert stored["spec"]["train"]["training"]["trainIters"] == 7


def test_every_example_applies_to_one_cluster_together(cluster):
    """No two examples share an object name: one `kubectl apply` of the folder creates every object once."""
    out = kubectl(cluster, "apply", "-f", str(QUICKSTART.parent), check=False)
    objects = [line for line in out.stdout.splitlines() if line.strip()]
    assert objects and all(line.endswith(" created") for line in objects), out.stdout + out.stderr
    assert out.returncode == 0, out.stderr
    assert len(objects) == len(set(objects))
