"""Training runtimes with the operator as a real process (docs/runtimes.md): a job that names one runs with its pod
settings and its own overrides; editing the runtime changes neither the job nor its restarted gang, only new jobs;
a locked field and a deleted runtime are refused before any pod exists, naming the runtime."""
from __future__ import annotations

import time

import pytest
import yaml
from kubernetes import client

from test_operator_train_job import (GROUP, VERSION, create, get_job, job, operator,  # noqa: F401
                                     phase_is, pods_of, set_pod_phase, wait_for)
from test_kubectl import kubectl

pytestmark = pytest.mark.operator

RUNTIMES = "ascendtrainingruntimes"


def _job(name, **spec):
    """A job that names the runtime and, unless told, leaves the image to it."""
    body = job(name, runtimeRef={"kind": "AscendTrainingRuntime", "name": "npu"}, **spec)
    if "image" not in spec:
        del body["spec"]["image"]
    return body


def test_jobs_run_with_their_runtime_recorded_once_and_refused_naming_it(operator, api_client, namespace, kubeconfig,
                                                                          tmp_path):
    ns = namespace
    api = client.CustomObjectsApi(api_client)
    api.create_namespaced_custom_object(GROUP, VERSION, ns, RUNTIMES, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "AscendTrainingRuntime", "metadata": {"name": "npu"},
        "spec": {"lockedFields": ["image"], "template": {
            "image": "registry.local/engine:v1", "devices": {"resource": "huawei.com/npu", "ringController": ""},
            "env": [{"name": "FROM_RUNTIME", "value": "1"}, {"name": "SHARED", "value": "runtime"}],
            "nodeSelector": {"pool": "npu"}, "terminationGracePeriodSeconds": 1200}}})
    create(api_client, ns, _job("a", env=[{"name": "SHARED", "value": "job"}], nodeSelector={"zone": "z1"}))
    pods = wait_for(lambda: len(p := pods_of(api_client, ns, "a")) == 2 and p, timeout=90, what="2 pods")
    for pod in pods:
        container = pod.spec.containers[0]
        env = {e.name: e.value for e in container.env}
        assert container.image == "registry.local/engine:v1" and container.resources.limits["huawei.com/npu"] == "1"
        assert env["FROM_RUNTIME"] == "1" and env["SHARED"] == "job"
        assert pod.spec.node_selector == {"pool": "npu", "zone": "z1"}
        assert pod.spec.termination_grace_period_seconds == 1200
    recorded = get_job(api_client, ns, "a")["status"]["runtime"]
    assert (recorded["kind"], recorded["name"], recorded["generation"]) == ("AscendTrainingRuntime", "npu", 1)
    assert len(recorded["hash"]) == 16

    # Edit the runtime, then force a gang restart: the job keeps what it was resolved with.
    api.patch_namespaced_custom_object(GROUP, VERSION, ns, RUNTIMES, "npu",
                                       {"spec": {"template": {"image": "registry.local/engine:v2"}}})
    for i in range(2):
        set_pod_phase(api_client, ns, f"a-{i}-0", "Running")
    phase_is(api_client, ns, "a", "Running")
    set_pod_phase(api_client, ns, "a-1-0", "Failed", exit_code=137)
    assert phase_is(api_client, ns, "a", "Restarting")["restarts"] == 1
    second = wait_for(lambda: [p for p in pods_of(api_client, ns, "a") if p.metadata.name.endswith("-1")] or None,
                      what="the restarted gang")
    assert {p.spec.containers[0].image for p in second} == {"registry.local/engine:v1"}
    assert get_job(api_client, ns, "a")["status"]["runtime"]["generation"] == 1
    # A new job sees the new runtime.
    create(api_client, ns, _job("b"))
    newer = wait_for(lambda: len(p := pods_of(api_client, ns, "b")) == 2 and p, what="b's pods")
    assert {p.spec.containers[0].image for p in newer} == {"registry.local/engine:v2"}
    assert get_job(api_client, ns, "b")["status"]["runtime"]["generation"] == 2

    # A locked field: kubectl apply is refused by the API server (the admission policy the CRDs come with), naming
    # the field, the runtime and the lock; the runtime's own value, or a field it does not lock, is admitted.
    def apply(name, **spec):
        manifest = tmp_path / f"{name}.yaml"
        manifest.write_text(yaml.safe_dump(_job(name, **spec)))
        return kubectl(kubeconfig, "apply", "--dry-run=server", "-f", str(manifest), check=False)

    refused = apply("c", image="my/own:1")
    assert refused.returncode != 0, refused.stdout
    assert f"spec.image: AscendTrainingRuntime {ns}/npu locks image (lockedFields)" in refused.stderr, refused.stderr
    for admitted in (apply("c", image="registry.local/engine:v2"), apply("c", nodeSelector={"pool": "gpu"})):
        assert admitted.returncode == 0 and "created (server dry run)" in admitted.stdout, admitted.stderr
    # The operator checks what the API server lets through (a lock below the fields the policy compares): Failed
    # before any pod, naming the runtime and the field.
    api.patch_namespaced_custom_object(GROUP, VERSION, ns, RUNTIMES, "npu",
                                       {"spec": {"lockedFields": ["image", "nodeSelector.pool"]}})
    create(api_client, ns, _job("c", nodeSelector={"pool": "gpu"}))
    failed = next(c for c in phase_is(api_client, ns, "c", "Failed")["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "RuntimeFieldLocked", failed
    assert f"spec.nodeSelector.pool: AscendTrainingRuntime {ns}/npu locks nodeSelector.pool" in failed["message"]
    assert pods_of(api_client, ns, "c") == []

    # Deleting the runtime leaves the jobs that use it alone and refuses new ones.
    api.delete_namespaced_custom_object(GROUP, VERSION, ns, RUNTIMES, "npu")
    create(api_client, ns, _job("d"))
    failed = next(c for c in phase_is(api_client, ns, "d", "Failed")["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "RuntimeNotFound" and f"AscendTrainingRuntime {ns}/npu not found" in failed["message"]
    set_pod_phase(api_client, ns, "a-0-1", "Running")
    set_pod_phase(api_client, ns, "a-1-1", "Running")
    assert phase_is(api_client, ns, "a", "Running")["runtime"]["name"] == "npu"
    time.sleep(1)
    assert get_job(api_client, ns, "b")["status"]["phase"] == "Pending"
    assert {p.spec.containers[0].image for p in pods_of(api_client, ns, "a") if p.metadata.name.endswith("-1")} == {
        "registry.local/engine:v1"}
