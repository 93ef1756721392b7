"""Job pods are locked down by default; a spec may state its own security contexts; the operator's policy on
hostNetwork and hostPath; reserved torchrun variables refused by the operator's own parse too."""
import pytest
from pydantic import ValidationError

from ascend_operator import settings
from ascend_operator.api.single_pod import DatasetPrepSpec
from ascend_operator.api.train_job import AscendTrainJobSpec
from ascend_operator.handlers import pod_policy
from ascend_operator.render import train_job as render
from ascend_operator.render.single_pod import pod as single_pod


def _spec(**overrides):
    spec = {"image": "engine:1", "nnodes": 2, "nprocPerNode": 1, "train": {"parallel": {"tensorModelParallelSize": 2}}}
    return AscendTrainJobSpec.model_validate({**spec, **overrides})


def test_pods_get_restricted_defaults():
    prep = DatasetPrepSpec.model_validate({"image": "e", "prep": {"input": "/i", "outputPrefix": "/o",
                                                                  "tokenizerNameOrPath": "/t"}})
    for pod in (render.pod("llm", "ns", _spec(), 1), single_pod("DatasetPrep", "p", prep, "preprocess")):
        container = pod["spec"]["containers"][0]
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                                "seccompProfile": {"type": "RuntimeDefault"}}
        assert pod["spec"]["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
        assert pod["spec"]["automountServiceAccountToken"] is False


def test_a_stated_security_context_replaces_the_default():
    root = {"runAsUser": 0, "capabilities": {"add": ["SYS_RAWIO"]}}
    pod = render.pod("llm", "ns", _spec(securityContext=root, podSecurityContext={"fsGroup": 1000},
                                        automountServiceAccountToken=True), 0)
    assert pod["spec"]["containers"][0]["securityContext"] == root
    assert pod["spec"]["securityContext"] == {"fsGroup": 1000}
    assert pod["spec"]["automountServiceAccountToken"] is True


def test_policy_denies_host_path_by_default_and_host_network_when_told(monkeypatch):
    spec = _spec(volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "d"}},
                          {"name": "drivers", "hostPath": {"path": "/usr/local/Ascend/driver"}}])
    message = pod_policy.denied(spec)
    assert message.startswith("spec.volumes[1] (drivers): Forbidden: hostPath volumes are denied")
    assert "jobPodPolicy.allowHostPath" in message
    monkeypatch.setattr(settings, "ALLOW_HOST_PATH", True)
    assert pod_policy.denied(spec) is None
    host = _spec(hostNetwork=True)
    assert pod_policy.denied(host) is None  # allowed by default: the operator assigns a port block
    monkeypatch.setattr(settings, "ALLOW_HOST_NETWORK", False)
    assert "jobPodPolicy.allowHostNetwork is false" in pod_policy.denied(host)


@pytest.mark.parametrize("name", ["MASTER_PORT", "RANK", "PET_NODE_RANK", "NPROC_PER_NODE"])
def test_reserved_env_is_refused_by_name(name):
    with pytest.raises(ValidationError, match=f"env {name} is set by the operator"):
        _spec(env=[{"name": "OK", "value": "1"}, {"name": name, "value": "x"}])


def test_env_value_from_and_env_from_render():
    spec = _spec(env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
                 envFrom=[{"configMapRef": {"name": "c"}}])
    container = render.pod("llm", "ns", spec, 0)["spec"]["containers"][0]
    assert {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}} in container["env"]
    assert container["envFrom"] == [{"configMapRef": {"name": "c"}}]
    with pytest.raises(ValidationError, match="may not have both value and valueFrom"):
        _spec(env=[{"name": "T", "value": "v", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}])


def test_grace_period_reaches_the_pod_and_torchrun():
    pod = render.pod("llm", "ns", _spec(), 0)
    assert pod["spec"]["terminationGracePeriodSeconds"] == 900
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "885"
    assert render.pod("llm", "ns", _spec(terminationGracePeriodSeconds=120), 0)["spec"][
        "terminationGracePeriodSeconds"] == 120
