"""The local pod runner: tiny `python -c` pods whose output and status show what a kubelet would do."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kubernetes import client, config

from ascend_cluster.cluster import LocalCluster
from ascend_cluster.runner import read_logs


WIDGET_GROUP, WIDGET_PLURAL = "example.dev", "widgets"  # a small CRD that is not ours: the CLI with any kind

WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{WIDGET_PLURAL}.{WIDGET_GROUP}"},
    "spec": {
        "group": WIDGET_GROUP,
        "scope": "Namespaced",
        "names": {"plural": WIDGET_PLURAL, "singular": "widget", "kind": "Widget", "shortNames": ["wg"]},
        "versions": [{
            "name": "v1", "served": True, "storage": True,
            "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {
                        "type": "object",
                        "required": ["size"],
                        "properties": {
                            "size": {"type": "integer", "minimum": 1},
                            "parts": {"type": "integer", "default": 1},
                            "color": {"type": "string", "enum": ["red", "blue"], "default": "red"},
                            "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                        "x-kubernetes-validations": [{
                            "rule": "self.size % self.parts == 0",
                            "message": "size must be divisible by parts", "fieldPath": ".size",
                        }],
                    },
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                },
            }},
        }],
    },
}


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """One node with two devices, run by the real scheduler and our node agent, for the whole module."""
    with LocalCluster(tmp_path_factory.mktemp("runner") / "cluster", crds_dir=None, fast_storage=True,
                      capacity={"huawei.com/Ascend910": 2}) as cluster:
        yield cluster


@pytest.fixture
def cluster_root(local) -> Path:
    return local.root


@pytest.fixture
def runner(local):
    return local.runner


@pytest.fixture
def core(local):
    configuration = client.Configuration()
    config.load_kube_config(str(local.kubeconfig), client_configuration=configuration)
    with client.ApiClient(configuration) as api:
        yield client.CoreV1Api(api)


@pytest.fixture
def ns(local, core, request) -> str:
    """A namespace of this test's own on the module's cluster, with its default ServiceAccount."""
    name = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower())[:50].strip("-")
    core.create_namespace({"metadata": {"name": name}})
    wait_for(lambda: [a.metadata.name for a in core.list_namespaced_service_account(name).items],
             lambda names: "default" in names)
    return name


def python_pod(name: str, code: str, restart: str = "Never", **spec) -> dict:
    container = {"name": "main", "image": "ignored:latest", "command": ["python", "-c", code]}
    container.update(spec.pop("container", {}))
    return {"metadata": {"name": name, "labels": {"app": "demo"}},
            "spec": {"restartPolicy": restart, "containers": [container], **spec}}


def wait_for(read, predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        obj = read()
        if predicate(obj):
            return obj
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; last state: {obj}")
        time.sleep(0.1)


def pod_phase(core, name, ns):
    return lambda: core.read_namespaced_pod(name, ns)


def test_env_dns_volumes_and_success(runner, core, ns, cluster_root: Path):
    core.create_namespaced_config_map(ns, {"metadata": {"name": "cfg"}, "data": {
        "conf.txt": f"data=/data/train.bin master=job-0.job.{ns}.svc.cluster.local", "mode": "fast"}})
    core.create_namespaced_secret(ns, {"metadata": {"name": "sec"}, "stringData": {"token": "s3cret"}})
    code = (
        "import os; e = os.environ; print('MASTER', e['MASTER_ADDR']); print('NAME', e['POD_NAME'], e['APP']);"
        "print('IP', e['POD_IP']); print('MODE', e['MODE'], e['TOKEN'], e['GREETING']);"
        "print('CONF', open('/etc/cfg/conf.txt').read()); print('DATA', e['DATA_DIR']);"
        "open(os.path.join(e['DATA_DIR'], 'out.txt'), 'w').write('written'); print('CWD', os.getcwd())"
    )
    pod = python_pod("job-1", code, hostname="job-1", subdomain="job", volumes=[
        {"name": "cfg", "configMap": {"name": "cfg"}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}},
    ], container={
        "workingDir": "/data",
        "env": [
            {"name": "MASTER_ADDR", "value": f"job-0.job.{ns}.svc"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "token"}}},
            {"name": "GREETING", "value": "hello-$(POD_NAME)-$(UNDEFINED)"},
            {"name": "DATA_DIR", "value": "/data"},
        ],
        "volumeMounts": [{"name": "cfg", "mountPath": "/etc/cfg"}, {"name": "data", "mountPath": "/data"}],
    })
    core.create_namespaced_persistent_volume_claim(ns, {"metadata": {"name": "datasets"}, "spec": {
        "accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}})
    core.create_namespaced_pod(ns, pod)
    # The master is named before it exists; its pod gets the same address when it starts.
    core.create_namespaced_pod(ns, python_pod("job-0", "print('master')", hostname="job-0", subdomain="job"))
    done = wait_for(pod_phase(core, "job-1", ns), lambda p: p.status.phase in ("Succeeded", "Failed"))
    master = wait_for(pod_phase(core, "job-0", ns), lambda p: p.status.phase == "Succeeded")
    out = read_logs(cluster_root, ns, "job-1")
    assert done.status.phase == "Succeeded", out
    pvc_dir = cluster_root / "pvc" / ns / "datasets"
    assert f"MASTER {master.status.pod_ip}" in out and master.status.pod_ip.startswith(runner.network.prefix + ".")
    assert done.status.pod_ip != master.status.pod_ip and f"IP {done.status.pod_ip}" in out
    assert "NAME job-1 demo" in out and "MODE fast s3cret hello-job-1-$(UNDEFINED)" in out
    # The process ran on the claim's host directory; its log shows the container's paths, as kubectl logs would.
    assert f"CONF data=/data/train.bin master={master.status.pod_ip}" in out
    assert "CWD /data" in out and (pvc_dir / "out.txt").read_text() == "written"
    terminated = done.status.container_statuses[0].state.terminated
    assert terminated.exit_code == 0 and terminated.reason == "Completed"
    assert done.spec.node_name == "local" and done.status.start_time is not None


@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")),
                    reason="no C compiler for the local pods' network shim (Debian: apt-get install -y gcc libc6-dev)")
def test_pods_listening_on_the_same_wildcard_port_each_get_their_own_ip(runner, core, ns, cluster_root: Path):
    """As in per-pod network namespaces: two pods bind ``0.0.0.0:<port>`` at once, each ends up on its own IP."""
    code = ("import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 29511)); s.listen();"
            "print('BOUND', s.getsockname()[0], flush=True); time.sleep(2)")
    for name in ("listen-a", "listen-b"):
        core.create_namespaced_pod(ns, python_pod(name, code))
    pods = [wait_for(pod_phase(core, name, ns), lambda p: p.status.phase in ("Succeeded", "Failed"))
            for name in ("listen-a", "listen-b")]
    for pod in pods:
        out = read_logs(cluster_root, ns, pod.metadata.name)
        assert pod.status.phase == "Succeeded", out
        assert f"BOUND {pod.status.pod_ip}" in out
    assert pods[0].status.pod_ip != pods[1].status.pod_ip


def test_failure_exit_code_and_on_failure_restarts(runner, core, ns, cluster_root: Path):
    core.create_namespaced_pod(ns, python_pod("fails", "import sys; print('bye'); sys.exit(3)"))
    counter = "import os, sys; p = '/work/count'; n = len(open(p).read()) if os.path.exists(p) else 0;" \
              "open(p, 'a').write('x'); print('attempt', n); sys.exit(0 if n >= 2 else 1)"
    core.create_namespaced_pod(ns, python_pod(
        "flaky", counter, restart="OnFailure", volumes=[{"name": "work", "emptyDir": {}}],
        container={"volumeMounts": [{"name": "work", "mountPath": "/work"}]}))
    failed = wait_for(pod_phase(core, "fails", ns), lambda p: p.status.phase in ("Succeeded", "Failed"))
    assert failed.status.phase == "Failed"
    terminated = failed.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (3, "Error")
    assert read_logs(cluster_root, ns, "fails") == "bye\n"
    flaky = wait_for(pod_phase(core, "flaky", ns), lambda p: p.status.phase in ("Succeeded", "Failed"))
    assert flaky.status.phase == "Succeeded"
    assert flaky.status.container_statuses[0].restart_count == 2
    assert flaky.status.container_statuses[0].last_state.terminated.exit_code == 1
    assert read_logs(cluster_root, ns, "flaky").splitlines() == ["attempt 0", "attempt 1", "attempt 2"]


def test_a_container_that_cannot_start_fails_alone(runner, core, ns):
    """A NUL byte in a variable (kube-apiserver accepts it; execve cannot pass it) is a StartError of that pod;
    it once failed every sync pass of the node, so no other pod on it started."""
    core.create_namespaced_pod(ns, python_pod("nul", "print(1)", container={"env": [
        {"name": "A", "value": "a\x00b"}]}))
    core.create_namespaced_pod(ns, python_pod("after-nul", "print(1)"))
    failed = wait_for(pod_phase(core, "nul", ns), lambda p: p.status.phase in ("Succeeded", "Failed"))
    terminated = failed.status.container_statuses[0].state.terminated
    assert (failed.status.phase, terminated.exit_code, terminated.reason) == ("Failed", 128, "StartError")
    assert "null byte" in terminated.message
    assert wait_for(pod_phase(core, "after-nul", ns), lambda p: p.status.phase == "Succeeded")


def test_a_pod_waits_for_its_config_map_and_starts_once_it_exists(runner, core, ns, cluster_root: Path):
    """As a kubelet: a missing ConfigMap keeps the pod Pending with CreateContainerConfigError and a Warning event,
    and the pod starts once the ConfigMap is created (the operator writes a job's ConfigMap and pods in one pass,
    and the node authorizer may learn of the binding after the node agent first asks)."""
    core.create_namespaced_pod(ns, python_pod("later", "print(open('/etc/cfg/greeting').read())",
                                              volumes=[{"name": "cfg", "configMap": {"name": "later-config"}}],
                                              container={"volumeMounts": [{"name": "cfg", "mountPath": "/etc/cfg"}]}))
    waiting = wait_for(pod_phase(core, "later", ns), lambda p: p.status.container_statuses and
                       p.status.container_statuses[0].state.waiting)
    assert waiting.status.phase == "Pending"
    assert waiting.status.container_statuses[0].state.waiting.reason == "CreateContainerConfigError"
    assert 'configmap "later-config" not found' in waiting.status.container_statuses[0].state.waiting.message
    warnings = [e.message for e in core.list_namespaced_event(ns).items if e.type == "Warning"]
    assert any("later-config" in m for m in warnings), warnings
    core.create_namespaced_config_map(ns, {"metadata": {"name": "later-config"}, "data": {"greeting": "hello"}})
    assert wait_for(pod_phase(core, "later", ns), lambda p: p.status.phase == "Succeeded")
    assert read_logs(cluster_root, ns, "later") == "hello\n"


def test_unschedulable_device_request_stays_pending(runner, core, ns):
    pod = python_pod("greedy", "print(1)", container={"resources": {"limits": {"huawei.com/Ascend910": "4"}}})
    core.create_namespaced_pod(ns, pod)
    pending = wait_for(pod_phase(core, "greedy", ns), lambda p: p.status.conditions)
    condition = pending.status.conditions[0]
    assert pending.status.phase == "Pending" and pending.spec.node_name is None
    assert (condition.type, condition.status, condition.reason) == ("PodScheduled", "False", "Unschedulable")
    assert condition.message.startswith("0/1 nodes are available: 1 Insufficient huawei.com/Ascend910."), \
        condition.message  # kube-scheduler's own words
    fits = python_pod("fits", "print(1)", container={"resources": {"limits": {"huawei.com/Ascend910": "2"}}})
    core.create_namespaced_pod(ns, fits)
    assert wait_for(pod_phase(core, "fits", ns), lambda p: p.status.phase == "Succeeded")


def test_deletion_terminates_the_process_group(runner, core, ns, cluster_root: Path):
    code = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: (print('term', flush=True), " \
           "sys.exit(0))); print('up', flush=True); time.sleep(600)"
    core.create_namespaced_pod(ns, python_pod("sleeper", code, terminationGracePeriodSeconds=30))
    running = wait_for(pod_phase(core, "sleeper", ns), lambda p: p.status.phase == "Running")
    pid = int(running.status.container_statuses[0].container_id.split("://")[1])
    wait_for(lambda: read_logs(cluster_root, ns, "sleeper"), lambda text: "up" in text)
    core.delete_namespaced_pod("sleeper", ns)
    wait_for(lambda: [p.metadata.name for p in core.list_namespaced_pod(ns).items], lambda names: not names)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert read_logs(cluster_root, ns, "sleeper").splitlines() == ["up", "term"]
    assert sys.executable  # the pod ran with the venv's python first on PATH


def test_local_cluster_and_cli_without_operator(tmp_path: Path, capsys):
    import yaml

    from ascend_train.cli import main
    from ascend_cluster.cluster import LocalCluster

    crds = tmp_path / "crds"
    crds.mkdir()
    columns = [{"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
               {"name": "Size", "type": "integer", "jsonPath": ".spec.size"}]
    crd = {**WIDGET_CRD, "spec": {**WIDGET_CRD["spec"], "versions": [
        {**WIDGET_CRD["spec"]["versions"][0], "additionalPrinterColumns": columns}]}}
    (crds / "widgets.yaml").write_text(yaml.safe_dump(crd))
    root = tmp_path / "cluster"
    manifest = tmp_path / "objects.yaml"
    manifest.write_text(yaml.safe_dump_all([
        {"apiVersion": "example.dev/v1", "kind": "Widget", "metadata": {"name": "big"}, "spec": {"size": 12}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hello"}, "spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "x", "command": ["python", "-c", "print('hi')"]}]}},
    ]))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"apiVersion": "example.dev/v1", "kind": "Widget", "metadata": {"name": "bad"},
                                   "spec": {"size": 0}}))
    for attempt in range(2):  # each start is fresh here; test_local_state.py covers starts that keep state
        with LocalCluster(root, fast_storage=True, crds_dir=crds, fresh=True) as cluster:
            assert cluster.kubeconfig.exists() and (root / ".ascend-local-cluster").exists()
            cli = ["--root", str(root)]
            assert main(cli + ["apply", "-f", str(manifest)]) == 0
            assert "widget.example.dev/big created" in capsys.readouterr().out
            assert main(cli + ["apply", "-f", str(bad)]) == 1
            err = capsys.readouterr().err
            assert err.startswith('Error from server: Widget.example.dev "bad" is invalid: spec.size: Invalid value: 0')
            assert "Traceback" not in err
            assert main(cli + ["get", "wg"]) == 0
            lines = capsys.readouterr().out.splitlines()
            assert lines[0].split() == ["NAME", "PHASE", "SIZE", "AGE"] and lines[1].split()[:3] == ["big", "<none>", "12"]
            configuration = client.Configuration()
            config.load_kube_config(str(cluster.kubeconfig), client_configuration=configuration)
            core = client.CoreV1Api(client.ApiClient(configuration))
            wait_for(lambda: core.read_namespaced_pod("hello", "default"), lambda p: p.status.phase == "Succeeded")
            assert main(cli + ["logs", "hello"]) == 0 and capsys.readouterr().out == "hi\n"
            # A job's replica <job>-<index> names its newest attempt's pod (<job>-<index>-<attempt>).
            for attempt, text in enumerate(["first try\n", "second try\n"]):
                (root / "pods" / "default" / f"job-1-{attempt}").mkdir(parents=True)
                (root / "pods" / "default" / f"job-1-{attempt}" / "container.log").write_text(text)
            assert main(cli + ["logs", "job-1"]) == 0 and capsys.readouterr().out == "second try\n"
            assert main(cli + ["logs", "job-1-0"]) == 0 and capsys.readouterr().out == "first try\n"
            # logs -f prints what the pod writes while it runs and returns when it has ended
            ticker = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ticker"}, "spec": {
                "restartPolicy": "Never", "containers": [{"name": "c", "image": "x", "command": [
                    "python", "-c", "import time\nfor i in range(4): print(i, flush=True); time.sleep(0.4)"]}]}}
            core.create_namespaced_pod("default", ticker)
            wait_for(lambda: core.read_namespaced_pod("ticker", "default"), lambda p: p.status.phase != "Pending")
            assert main(cli + ["logs", "-f", "ticker"]) == 0
            assert capsys.readouterr().out == "0\n1\n2\n3\n"
            # `get pods | head`: the reader went away; no traceback, the SIGPIPE status
            read_end, write_end = os.pipe()
            os.close(read_end)
            done = subprocess.run([sys.executable, "-m", "ascend_train.cli", *cli, "get", "pods"],
                                  stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60)
            os.close(write_end)
            assert (done.returncode, done.stderr) == (141, "")
            assert main(cli + ["delete", "widget", "big"]) == 0
            assert main(cli + ["get", "widgets"]) == 0 and "No resources found" in capsys.readouterr().out
    assert main(["--root", str(root), "get", "pods"]) == 1  # stopped: the CLI says so without a traceback
    assert "cannot reach the local cluster" in capsys.readouterr().err


@pytest.mark.parametrize("volume, mount, says", [
    # a claim is only ever its bound volume's path, never a path made of its name
    ({"persistentVolumeClaim": {"claimName": "../../../etc"}}, {}, 'persistentvolumeclaim "../../../etc" not found'),
    ({"hostPath": {"path": "/../../../etc"}}, {}, "must be a relative path without '..'"),
    ({"emptyDir": {}}, {"subPath": "../../../../etc"}, "subPath '../../../../etc': must be a relative path"),
    ({"emptyDir": {}}, {"subPath": "/etc"}, "subPath '/etc': must be a relative path"),
    ({"emptyDir": {}}, {"subPath": "link/passwd"}, "resolves outside the volume"),
])
def test_volumes_stay_inside_the_cluster_root(tmp_path: Path, volume, mount, says):
    """No claim name, hostPath or subPath reaches a directory outside the cluster's root (``../../../etc``)."""
    from ascend_cluster.pod_environment import PodSetupError, prepare_volumes

    pod_dir, root = tmp_path / "pod", tmp_path / "root"
    (pod_dir / "volumes" / "v").mkdir(parents=True)
    (pod_dir / "volumes" / "v" / "link").symlink_to("/etc")
    pod = {"metadata": {"name": "p", "namespace": "default"},
           "spec": {"volumes": [{"name": "v", **volume}],
                    "containers": [{"name": "c", "volumeMounts": [{"name": "v", "mountPath": "/data", **mount}]}]}}
    with pytest.raises(PodSetupError, match=re.escape(says)):
        prepare_volumes(pod, pod_dir, root, lambda *_: None, str)
    pod["spec"]["volumes"] = [{"name": "v", "hostPath": {"path": "/usr/local/Ascend"}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "v", "mountPath": "/data", "subPath": "driver"}]
    mounts = prepare_volumes(pod, pod_dir, root, lambda *_: None, str)
    assert mounts["/data"] == (root / "hostpath" / "usr/local/Ascend" / "driver").resolve()
