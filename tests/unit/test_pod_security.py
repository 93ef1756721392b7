"""Job pods are locked down by default; a spec may state its own security contexts; the operator's policy on
hostNetwork and hostPath; reserved torchrun variables refused by the operator's own parse too."""
import pytest
from pydantic import ValidationError

from ascend_operator import settings
from ascend_operator.api.single_pod import DatasetPrepSpec
from ascend_operator.api.train_job import AscendTrainJobSpec
from ascend_operator.kinds import pod_policy
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
    assert pod["spec"]["containers"][0]["securityContext"] == {**root, "allowPrivilegeEscalation": False}
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


@pytest.mark.parametrize("context, field, value", [
    ({"privileged": True}, "spec.securityContext.privileged", ("ALLOW_PRIVILEGED", True)),
    ({"capabilities": {"add": ["NET_BIND_SERVICE", "SYS_ADMIN"]}}, "spec.securityContext.capabilities.add",
     ("ALLOWED_CAPABILITIES", frozenset({"NET_BIND_SERVICE", "SYS_ADMIN"}))),
    ({"allowPrivilegeEscalation": True}, "spec.securityContext.allowPrivilegeEscalation",
     ("ALLOW_PRIVILEGE_ESCALATION", True)),
    ({"procMount": "Unmasked"}, "spec.securityContext.procMount", ("ALLOW_UNMASKED_PROC_MOUNT", True)),
])
def test_policy_denies_what_the_pod_security_standards_deny_unless_allowed(monkeypatch, context, field, value):
    spec = _spec(securityContext=context)
    message = pod_policy.denied(spec)
    assert message.startswith(f"{field}: Forbidden: this operator's policy denies") and "jobPodPolicy." in message
    monkeypatch.setattr(settings, *value)
    assert pod_policy.denied(spec) is None


def test_adding_one_allowed_capability_does_not_allow_another(monkeypatch):
    monkeypatch.setattr(settings, "ALLOWED_CAPABILITIES", frozenset({"SYS_RAWIO"}))
    assert pod_policy.denied(_spec(securityContext={"capabilities": {"add": ["CAP_SYS_RAWIO"]}})) is None
    message = pod_policy.denied(_spec(securityContext={"capabilities": {"add": ["SYS_RAWIO", "SYS_PTRACE"]}}))
    assert "denies adding SYS_PTRACE (chart value jobPodPolicy.allowedCapabilities allows: SYS_RAWIO)" in message


@pytest.mark.parametrize("mount_path, over", [("/etc/ascendtrain", "/etc/ascendtrain"), ("/etc", "/etc/ascendtrain"),
                                              ("/dev", "/dev/termination-log"), ("/dev/shm", "/dev/shm"),
                                              ("/etc/ascendtrain/extra", "/etc/ascendtrain")])
def test_mounts_over_the_engines_own_paths_are_refused(mount_path, over):
    spec = _spec(volumes=[{"name": "v", "emptyDir": {}}], volumeMounts=[{"name": "v", "mountPath": mount_path}])
    assert pod_policy.denied(spec) == (
        f"spec.volumeMounts[0].mountPath: Forbidden: {mount_path} is over {over}, which the operator mounts for the "
        "engine (its config, /dev/shm and the termination message); mount elsewhere")
    assert pod_policy.denied(_spec(volumes=[{"name": "v", "emptyDir": {}}],
                                   volumeMounts=[{"name": "v", "mountPath": "/workspace"}])) is None


def test_torchrun_variables_are_explicit_env_which_wins_over_env_from():
    """Kubernetes gives env precedence over envFrom: a ConfigMap's RANK or WORLD_SIZE cannot reach torchrun."""
    container = render.pod("llm", "ns", _spec(envFrom=[{"configMapRef": {"name": "c"}}]), 1)["spec"]["containers"][0]
    explicit = {e["name"] for e in container["env"]}
    assert {"MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "NPROC_PER_NODE", "WORLD_SIZE"} <= explicit
