"""Pod templates kube-apiserver refuses, and Secrets passed by reference, with the operator as a real process
against the session's control plane."""
from __future__ import annotations

import base64

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from ascend_operator.lifecycle import create_errors
from test_operator_lifecycle import events_of
from test_operator_train_job import (GROUP, PLURAL, VERSION, create, get_job, job, operator,  # noqa: F401
                                     phase_is, pods_of, set_pod_phase, wait_for)

pytestmark = pytest.mark.operator

SECRET_VALUE = "hf_s3cr3t-Token-0123456789"


REFUSED = [  # (job, spec, reason, what the message says)
    ("clash", {"volumes": [{"name": "dshm", "emptyDir": {}}]}, "InvalidPodTemplate",
     'creating Pod/clash-0-0 failed: Pod "clash-0-0" is invalid: spec.volumes[2].name: Duplicate value: "dshm"'),
    ("tol", {"tolerations": [{"key": "npu", "operator": "Equals", "effect": "NoSchedule"}]}, "InvalidPodTemplate",
     'creating Pod/tol-0-0 failed: Pod "tol-0-0" is invalid: spec.tolerations[0].operator: Unsupported value: '
     '"Equals": supported values: "Equal", "Exists"'),
    ("aff", {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": ""}]}}}, "InvalidPodTemplate",
     # kube-apiserver also says that "" is no qualified name: two causes, listed in brackets
     'creating Pod/aff-0-0 failed: Pod "aff-0-0" is invalid: [spec.affinity.podAntiAffinity.'
     "requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey: Required value: can not be empty"),
    ("hp", {"volumes": [{"name": "drv", "hostPath": {"path": "/usr/local/Ascend"}}]}, "PolicyViolation",
     "spec.volumes[0] (drv): Forbidden: hostPath volumes are denied by this operator's policy"),
    # An unknown field: the operator creates pods with fieldValidation=Strict, so the server refuses it instead of
    # dropping it (its default) and tolerating every taint: a permanent failure, not a retry loop.
    ("keyy", {"tolerations": [{"keyy": "npu", "operator": "Exists"}]}, "InvalidPodTemplate",
     'creating Pod/keyy-0-0 failed: Pod in version "v1" cannot be handled as a Pod: strict decoding error: '
     'unknown field "spec.tolerations[0].keyy"'),
    ("priv", {"securityContext": {"privileged": True}}, "PolicyViolation",
     "spec.securityContext.privileged: Forbidden: this operator's policy denies privileged containers"),
]


def test_a_refused_pod_fails_the_job_with_the_servers_message(operator, api_client, namespace):
    for name, spec, _, _ in REFUSED:
        create(api_client, namespace, job(name, **spec))
    for name, _, reason, says in REFUSED:
        failed = phase_is(api_client, namespace, name, "Failed")
        condition = next(c for c in failed["conditions"] if c["type"] == "Failed")
        assert condition["reason"] == reason and says in condition["message"], condition
        wait_for(lambda: any(says in message for _, message in events_of(api_client, namespace, name)),
                 what="a Warning event with the message")
        warnings = [e for e in client.CoreV1Api(api_client).list_namespaced_event(namespace).items
                    if e.involved_object.name == name and says in e.message]
        assert warnings and all(e.type == "Warning" for e in warnings)
        assert pods_of(api_client, namespace, name) == []


def test_a_pod_refused_on_resume_posts_the_refusal_not_the_resume(operator, api_client, namespace):
    """Resumed and Failed are set in the same second: the Failed event must carry the server's refusal."""
    name, spec, _, says = REFUSED[1]
    create(api_client, namespace, job(f"{name}-resumed", runPolicy={"suspend": True}, **spec))
    phase_is(api_client, namespace, f"{name}-resumed", "Suspended")
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, f"{name}-resumed", {"spec": {"runPolicy": {"suspend": False}}})
    phase_is(api_client, namespace, f"{name}-resumed", "Failed")
    says = says.replace(f"{name}-0-0", f"{name}-resumed-0-0")
    wait_for(lambda: [m for r, m in events_of(api_client, namespace, f"{name}-resumed") if r == "Failed"],
             what="Failed event")
    assert [says in m for r, m in events_of(api_client, namespace, f"{name}-resumed") if r == "Failed"] == [True]


def test_a_missing_service_account_holds_the_job_back_until_it_exists(operator, api_client, namespace):
    """kube-apiserver's ServiceAccount admission refuses the pods (403): the job says why and tries again with
    backoff, and goes on once the account is made."""
    create(api_client, namespace, job("needs-sa", serviceAccountName="trainer"))
    says = f'is forbidden: error looking up service account {namespace}/trainer: serviceaccount "trainer" not found'

    def refused():
        conditions = (get_job(api_client, namespace, "needs-sa").get("status") or {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == "Created" and c["status"] == "False"), None)
    created = wait_for(refused, what="Created=False")
    assert created["reason"] == "CreateFailed" and says in created["message"], created
    wait_for(lambda: any(says in m for _, m in events_of(api_client, namespace, "needs-sa")), what="a Warning event")
    client.CoreV1Api(api_client).create_namespaced_service_account(namespace, {"metadata": {"name": "trainer"}})
    pods = wait_for(lambda: len(p := pods_of(api_client, namespace, "needs-sa")) == 2 and p, timeout=60,
                    what="the pods once the account exists (after the 5 s backoff)")
    assert {p.spec.service_account_name for p in pods} == {"trainer"}


def test_secrets_pass_by_reference_and_their_values_appear_nowhere(operator, api_client, namespace, tmp_path):
    core = client.CoreV1Api(api_client)
    core.create_namespaced_secret(namespace, {"metadata": {"name": "hf"}, "stringData": {"token": SECRET_VALUE}})
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "tuning"}, "data": {"NCCL_DEBUG": "WARN"}})
    secret_env = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    create(api_client, namespace, job(
        "sec", env=[secret_env, {"name": "PLAIN", "value": "1"}],
        envFrom=[{"secretRef": {"name": "hf"}, "prefix": "HF_"}, {"configMapRef": {"name": "tuning"}}],
        volumes=[{"name": "creds", "secret": {"secretName": "hf"}}],
        volumeMounts=[{"name": "creds", "mountPath": "/var/run/creds", "readOnly": True}]))
    pods = wait_for(lambda: len(p := pods_of(api_client, namespace, "sec")) == 2 and p, what="pods")
    for pod in pods:
        container = api_client.sanitize_for_serialization(pod.spec.containers[0])
        env = {e["name"]: e for e in container["env"]}
        assert env["HF_TOKEN"] == secret_env and env["PLAIN"]["value"] == "1"
        assert container["envFrom"] == [{"secretRef": {"name": "hf"}, "prefix": "HF_"},
                                        {"configMapRef": {"name": "tuning"}}]
        assert {"name": "creds", "mountPath": "/var/run/creds", "readOnly": True} in container["volumeMounts"]
        # kube-apiserver defaults the volume's file mode (0644)
        assert {"name": "creds", "secret": {"secretName": "hf", "defaultMode": 0o644}} in \
            api_client.sanitize_for_serialization(pod.spec)["volumes"]
    for pod in pods:
        set_pod_phase(api_client, namespace, pod.metadata.name, "Running")
    phase_is(api_client, namespace, "sec", "Running")
    set_pod_phase(api_client, namespace, "sec-1-0", "Failed", exit_code=1)
    phase_is(api_client, namespace, "sec", "Failed")
    encoded = base64.b64encode(SECRET_VALUE.encode()).decode()
    seen = [repr(get_job(api_client, namespace, "sec")),
            repr([e.to_dict() for e in core.list_namespaced_event(namespace).items]),
            repr([c.data for c in core.list_namespaced_config_map(namespace).items]),
            (tmp_path / "operator.log").read_text()]
    for text in seen:
        assert SECRET_VALUE not in text and encoded not in text


def test_other_refusals_back_off_and_say_so():
    """A 403 (say, a ResourceQuota) is not permanent: Created=False with the message, the next try later."""
    key = ("AscendTrainJob", "default", "quota")
    quota = ApiException(status=403, reason="Forbidden")
    quota.body = '{"kind": "Status", "message": "pods \\"quota-0\\" is forbidden: exceeded quota: npu"}'
    try:
        status, message, permanent = create_errors.failed(key, "Pod/quota-0", quota, {"phase": "Pending"}, "t")
        assert not permanent and status["phase"] == "Pending" and not create_errors.due(key)
        (created,) = status["conditions"]
        assert (created["type"], created["status"], created["reason"]) == ("Created", "False", "CreateFailed")
        assert 'exceeded quota: npu' in created["message"] and "attempt 1; next in 5s" in created["message"]
        _, message, _ = create_errors.failed(key, "Pod/quota-0", quota, status, "t")
        assert "attempt 2; next in 10s" in message
    finally:
        create_errors.reset(key)
    assert create_errors.due(key)
