"""The operator, as a real process, against the loopback Kubernetes API: create -> pods -> status.

The test plays the kubelet's part by patching pod status, so every transition is driven by exactly what a
cluster would report.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.operator

CRDS = Path(__file__).resolve().parents[2] / "crds"
GROUP, VERSION, PLURAL = "ascendtrain.dev", "v1alpha1", "ascendtrainjobs"


def wait_for(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last value: {last!r}")


@pytest.fixture
def operator(local_api, api_client, tmp_path):
    ext = client.ApiextensionsV1Api(api_client)
    for path in sorted(CRDS.glob("*.yaml")):
        ext.create_custom_resource_definition(yaml.safe_load(path.read_text()))
    with socket.socket() as s:  # a free port for the operator's own metrics
        s.bind(("127.0.0.1", 0))
        metrics_port = s.getsockname()[1]
    env = dict(os.environ, KUBECONFIG=str(tmp_path / "kubeconfig"), ASCEND_OPERATOR_PROGRESS_INTERVAL="1",
               ASCEND_OPERATOR_METRICS_PORT=str(metrics_port), ASCEND_OPERATOR_DASHBOARD_PORT="0")
    log = open(tmp_path / "operator.log", "w")

    def start():
        return subprocess.Popen([sys.executable, "-m", "ascend_operator.main", "run", "-A", "--standalone"],
                                env=env, stdout=log, stderr=subprocess.STDOUT)

    procs = [start()]
    yield type("Operator", (), {"metrics_url": f"http://127.0.0.1:{metrics_port}/metrics",
                                "restart": lambda self: (procs[-1].terminate(), procs[-1].wait(10),
                                                         procs.append(start()))})()
    for p in procs:
        p.terminate()
        p.wait(10)
    log.close()
    print((tmp_path / "operator.log").read_text()[-4000:])


def job(name, **spec):
    base = {"image": "engine:test", "nnodes": 2, "nprocPerNode": 1,
            "train": {"parallel": {"tensorModelParallelSize": 2}, "observability": {"metricsPort": 9400}}}
    base.update(spec)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AscendTrainJob",
            "metadata": {"name": name, "namespace": "default"}, "spec": base}


def get_job(api_client, name):
    return client.CustomObjectsApi(api_client).get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)


def pods_of(api_client, name):
    core = client.CoreV1Api(api_client)
    items = core.list_namespaced_pod("default", label_selector=f"ascendtrain.dev/job-name={name}").items
    return sorted(items, key=lambda p: p.metadata.name)


def set_pod_phase(api_client, pod_name, phase, exit_code=None):
    """What a kubelet reports."""
    status = {"phase": phase, "podIP": "127.0.0.1"}
    if phase == "Running":
        status["conditions"] = [{"type": "Ready", "status": "True"}]
        status["containerStatuses"] = [{"name": "engine", "ready": True, "restartCount": 0, "image": "x",
                                        "imageID": "", "state": {"running": {}}}]
    if exit_code is not None:
        status["containerStatuses"] = [{"name": "engine", "ready": False, "restartCount": 0, "image": "x",
                                        "imageID": "", "state": {"terminated": {"exitCode": exit_code,
                                                                                "reason": "Error"}}}]
    client.CoreV1Api(api_client).patch_namespaced_pod_status(pod_name, "default", {"status": status})


def test_job_gets_service_configmap_and_pods_then_follows_them(operator, api_client):
    custom = client.CustomObjectsApi(api_client)
    created = custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, job("llm"))
    pods = wait_for(lambda: len(pods_of(api_client, "llm")) == 2 and pods_of(api_client, "llm"), what="2 pods")
    core = client.CoreV1Api(api_client)
    service = core.read_namespaced_service("llm", "default")
    assert service.spec.cluster_ip == "None"
    config = yaml.safe_load(core.read_namespaced_config_map("llm-config", "default").data["config.yaml"])
    assert config["parallel"]["tensorModelParallelSize"] == 2
    for index, pod in enumerate(pods):
        env = {e.name: e.value for e in pod.spec.containers[0].env}
        assert env["MASTER_ADDR"] == "llm-0.llm.default.svc" and env["NODE_RANK"] == str(index)
        assert env["WORLD_SIZE"] == "2" and env["PET_NNODES"] == "2"
        assert pod.spec.hostname == f"llm-{index}" and pod.spec.subdomain == "llm"
        [owner] = pod.metadata.owner_references
        assert owner.uid == created["metadata"]["uid"] and owner.kind == "AscendTrainJob" and owner.controller

    status = wait_for(lambda: get_job(api_client, "llm").get("status", {}).get("phase"), what="a phase")
    assert status == "Pending"
    set_pod_phase(api_client, "llm-0-0", "Running")
    set_pod_phase(api_client, "llm-1-0", "Running")
    running = wait_for(lambda: (s := get_job(api_client, "llm").get("status", {})).get("phase") == "Running" and s,
                       what="Running")
    assert running["replicas"]["ready"] == 2 and running["startTime"]
    set_pod_phase(api_client, "llm-0-0", "Succeeded", exit_code=0)
    set_pod_phase(api_client, "llm-1-0", "Succeeded", exit_code=0)
    done = wait_for(lambda: (s := get_job(api_client, "llm").get("status", {})).get("phase") == "Succeeded" and s,
                    what="Succeeded")
    assert {c["type"]: c["status"] for c in done["conditions"]}["Succeeded"] == "True"
    assert done["completionTime"]


def test_a_failed_pod_fails_the_job_with_its_exit_code(operator, api_client):
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, job("bad"))
    wait_for(lambda: len(pods_of(api_client, "bad")) == 2, what="2 pods")
    set_pod_phase(api_client, "bad-0-0", "Running")
    set_pod_phase(api_client, "bad-1-0", "Failed", exit_code=3)
    status = wait_for(lambda: (s := get_job(api_client, "bad").get("status", {})).get("phase") == "Failed" and s,
                      what="Failed")
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "PodFailed" and "bad-1-0" in failed["message"] and "exit code 3" in failed["message"]


def test_restarting_the_operator_creates_nothing_twice(operator, api_client):
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, job("idem"))
    first = wait_for(lambda: len(pods_of(api_client, "idem")) == 2 and pods_of(api_client, "idem"), what="pods")
    operator.restart()
    time.sleep(3)  # the new operator resumes the job
    again = pods_of(api_client, "idem")
    assert [p.metadata.uid for p in again] == [p.metadata.uid for p in first]
    assert len(client.CoreV1Api(api_client).list_namespaced_service("default").items) == 1


def test_invalid_jobs_are_rejected_naming_the_field(operator, api_client):
    custom = client.CustomObjectsApi(api_client)
    # The API server's CEL rule: world size 3 is not divisible by TP=2.
    with pytest.raises(ApiException) as err:
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, job("odd", nnodes=3))
    assert err.value.status == 422
    assert "nnodes x nprocPerNode must be divisible by" in err.value.body
    # Beyond CEL: the engine's model (heads not divisible by TP) -> the operator marks it Failed, naming the field.
    bad = job("heads", train={"model": {"numAttentionHeads": 3, "hiddenSize": 96},
                              "parallel": {"tensorModelParallelSize": 2}})
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, bad)
    status = wait_for(lambda: (s := get_job(api_client, "heads").get("status", {})).get("phase") == "Failed" and s,
                      what="Failed")
    message = status["conditions"][0]["message"]
    assert status["conditions"][0]["reason"] == "InvalidSpec"
    assert "spec.train" in message and "tensorModelParallelSize (2) must divide model.numAttentionHeads (3)" in message
    assert pods_of(api_client, "heads") == []
