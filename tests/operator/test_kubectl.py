"""The real ``kubectl`` (the control plane's own release, first on PATH) on our resources, as a user types it: the
printer columns of `kubectl get atj` (and -o wide), `kubectl explain`, server-side dry runs, what a re-apply may
change, the examples applied together, `ascend-train get` saying why a job failed. These run on the session's
control plane, each test in its own namespace (the kubeconfig's context namespace).

The tests whose pods must really run (`kubectl logs` through the local node's kubelet API, the events the node
posts) share one local cluster of this module.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from ascend_cluster.cluster import LocalCluster
from ascend_cluster.resource_client import ResourceClient
from ascend_operator.api.train_job import TrainProgress
from ascend_train.cli import main as ascend_train
from e2e.workspace import create_workspace, quickstart_job

pytestmark = pytest.mark.operator

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def kubectl(target: LocalCluster | Path, *args: str, check: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess:
    """kubectl with ``target``'s kubeconfig: a local cluster's, or a kubeconfig file (the test's: its context
    namespace is the test's namespace). HOME is the kubeconfig's folder, so its discovery cache is the test's."""
    kubeconfig, home = ((target.kubeconfig, target.root) if isinstance(target, LocalCluster)
                        else (Path(target), Path(target).parent))
    env = dict(os.environ, KUBECONFIG=str(kubeconfig), HOME=str(home))
    result = subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    return result


def rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


def job_named(name: str) -> dict:
    """The quickstart's job as ``name``, in no namespace of its own (kubectl's context namespace applies)."""
    job = quickstart_job()
    job["metadata"] = {"name": name}
    return job


def write(folder: Path, name: str, *docs: dict) -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


# -- on the session's control plane ---------------------------------------------------------------------------

def test_get_atj_shows_the_crd_printer_columns(kubeconfig, namespace):
    with ResourceClient(kubeconfig) as resources:
        atj = resources.resolve("atj")
        job = job_named("columns")
        job["spec"]["runtimeRef"] = {"name": "cpu"}  # a cluster runtime (the chart's); the column shows it
        job["spec"]["train"]["observability"]["trackers"] = [  # kube-apiserver takes the trackers' schema
            {"type": "mlflow", "trackingUri": "http://mlflow.example:5000", "credentialsSecret": "mlflow-token"}]
        resources.apply(job, namespace)
        raw = {"iteration": 12, "loss": 1.5500773191452026, "tokensPerSecond": 812.6}
        progress = TrainProgress.with_columns(raw)  # what the operator writes
        cause = "pod columns-1-0 failed: exit code 1 (Error)"
        resources.request("PATCH", atj.path(namespace, "columns", "status"), {"status": {
            "phase": "Failed", "restarts": 1, "progress": progress, "evaluation": {"summary": "mmlu=0.2500"},
            "elastic": {"desiredNodes": 4, "currentNodes": 2, "nodes": "2/4"},
            "tracking": [{"tracker": "mlflow", "runId": "5f1e0c", "url": "http://mlflow.example:5000/#/runs/5f1e0c"}],
            "conditions": [{"type": "Failed", "status": "True", "reason": "PodFailed", "message": cause,
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}},
            content_type="application/merge-patch+json")
    table = rows(kubectl(kubeconfig, "get", "atj").stdout)
    assert table[0] == ["NAME", "PHASE", "ITER", "LOSS", "TOK/S", "EVAL", "RESTARTS", "RUNTIME", "AGE"]
    assert table[1][:8] == ["columns", "Failed", "12", "1.550", "813", "mmlu=0.2500", "1", "cpu"]  # for humans
    assert table[1][8].endswith("s")  # an age computed by kubectl from the date column
    stored = json.loads(kubectl(kubeconfig, "get", "atj", "columns", "-o", "json").stdout)["status"]["progress"]
    assert {k: stored[k] for k in raw} == raw  # the raw figures stay in status
    wide = kubectl(kubeconfig, "get", "atj", "-o", "wide").stdout.splitlines()
    assert wide[0].split() == ["NAME", "PHASE", "ITER", "LOSS", "TOK/S", "EVAL", "RESTARTS", "RUNTIME", "NODES", "AGE",
                               "FAILURE"]
    assert wide[1].split()[:9] == ["columns", "Failed", "12", "1.550", "813", "mmlu=0.2500", "1", "cpu", "2/4"]
    assert wide[1].endswith(cause)
    described = kubectl(kubeconfig, "describe", "atj", "columns").stdout  # where the run is tracked
    tracking = described.split("Tracking:", 1)[1]
    assert re.search(r"Run Id:\s+5f1e0c", tracking) and re.search(r"Tracker:\s+mlflow", tracking), described
    assert "http://mlflow.example:5000/#/runs/5f1e0c" in tracking, described


def test_kubectl_explain_describes_our_fields(kubeconfig):
    """The CRD's descriptions (from the models' docstrings) as kubectl explain prints them."""
    out = kubectl(kubeconfig, "explain", "atj.spec.train.parallel.tensorModelParallelSize").stdout
    assert out.splitlines()[:3] == ["GROUP:      ascendtrain.dev", "KIND:       AscendTrainJob",
                                    "VERSION:    v1alpha1"], out
    assert "FIELD: tensorModelParallelSize <integer>" in out, out
    assert out.split("DESCRIPTION:", 1)[1].split() == ["Tensor", "parallel", "size", "(TP)."], out
    fields = kubectl(kubeconfig, "explain", "dsp.spec").stdout
    assert re.search(r"^\s+prep\s+<Object> -required-", fields, re.M), fields


def test_ascend_train_get_says_why_a_job_failed(kubeconfig, namespace, capsys):
    with ResourceClient(kubeconfig) as resources:
        atj = resources.resolve("atj")
        resources.apply(job_named("broken"), namespace)
        cause = "pod broken-0 failed: exit code 1 (Error): FileNotFoundError: config.json missing in /models/x"
        resources.request("PATCH", atj.path(namespace, "broken", "status"), {"status": {
            "phase": "Failed", "conditions": [{"type": "Failed", "status": "True", "reason": "PodFailed",
                                               "message": cause, "lastTransitionTime": "2026-01-01T00:00:00Z"}]}},
            content_type="application/merge-patch+json")
    capsys.readouterr()
    assert ascend_train(["--root", str(kubeconfig.parent), "get", "atj", "-n", namespace]) == 0
    assert f"broken failed: {cause}" in capsys.readouterr().out.splitlines()


def test_apply_server_dry_run_validates_without_storing(kubeconfig, tmp_path):
    job = job_named("dry")
    out = kubectl(kubeconfig, "apply", "--dry-run=server", "-f", str(write(tmp_path, "dry.yaml", job)))
    assert "ascendtrainjob.ascendtrain.dev/dry created (server dry run)" in out.stdout
    assert kubectl(kubeconfig, "get", "atj", "dry", check=False).returncode != 0  # nothing was stored
    job["spec"]["train"]["parallel"]["tensorModelParallelSize"] = 3  # 2 pods x 1 device cannot hold TP=3
    bad = kubectl(kubeconfig, "apply", "--dry-run=server", "-f", str(write(tmp_path, "dry.yaml", job)), check=False)
    assert bad.returncode != 0 and 'The AscendTrainJob "dry" is invalid' in bad.stderr, bad.stderr
    assert "nnodes x nprocPerNode must be divisible by" in bad.stderr, bad.stderr
    # experiment trackers: an MLflow tracker without its server, a tracker named twice (the list is keyed by type)
    job["spec"]["train"]["parallel"]["tensorModelParallelSize"] = 2
    job["spec"]["train"]["observability"]["trackers"] = [{"type": "mlflow"}, {"type": "wandb"}, {"type": "wandb"}]
    bad = kubectl(kubeconfig, "apply", "--dry-run=server", "-f", str(write(tmp_path, "dry.yaml", job)), check=False)
    assert "trackers: mlflow needs trackingUri" in bad.stderr and "Duplicate value" in bad.stderr, bad.stderr


def test_reapply_changes_run_policy_and_refuses_other_spec_changes(kubeconfig, tmp_path):
    """The spec is immutable but for runPolicy (as a Job's template): never `configured` while nothing runs it."""
    job = job_named("applied")
    path = write(tmp_path, "applied.yaml", job)
    assert "ascendtrainjob.ascendtrain.dev/applied created" in kubectl(kubeconfig, "apply", "-f", str(path)).stdout
    job["spec"]["runPolicy"] = {"backoffLimit": 1, "suspend": True}
    write(tmp_path, "applied.yaml", job)
    assert "ascendtrainjob.ascendtrain.dev/applied configured" in kubectl(kubeconfig, "apply", "-f", str(path)).stdout
    job["spec"]["train"]["training"]["trainIters"] = 7
    job["spec"]["tolerations"] = [{"key": "npu", "operator": "Exists"}]  # a field the stored spec lacks
    write(tmp_path, "applied.yaml", job)
    refused = kubectl(kubeconfig, "apply", "-f", str(path), check=False)
    assert refused.returncode != 0 and "configured" not in refused.stdout
    for field in ("spec.train", "spec.tolerations"):
        assert f"{field}: Forbidden: may not change once the job exists (only spec.runPolicy may)" in refused.stderr
    assert "kubectl replace --force -f FILE" in refused.stderr
    stored = yaml.safe_load(kubectl(kubeconfig, "get", "atj", "applied", "-o", "yaml").stdout)
    assert stored["spec"]["train"]["training"]["trainIters"] == 30 and stored["spec"]["runPolicy"]["backoffLimit"] == 1
    kubectl(kubeconfig, "replace", "--force", "-f", str(path))  # how to rerun: a new object with the new spec
    stored = yaml.safe_load(kubectl(kubeconfig, "get", "atj", "applied", "-o", "yaml").stdout)
    assert stored["spec"]["train"]["training"]["trainIters"] == 7


def test_every_example_applies_to_one_namespace_together(kubeconfig, namespace, tmp_path):
    """No two examples share an object name: one `kubectl apply` of the folder creates every object once (the
    pipelines' workspace claim, the same in each, is created by the first and unchanged by the others)."""
    folder = tmp_path / "examples"
    folder.mkdir()
    for path in sorted(EXAMPLES.glob("*.yaml")):  # as written, in the test's namespace instead of default
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        for doc in docs:
            assert doc["metadata"].pop("namespace", "default") == "default", path
        write(folder, path.name, *docs)
    out = kubectl(kubeconfig, "apply", "-f", str(folder), check=False)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    created = [line.removesuffix(" created") for line in lines if line.endswith(" created")]
    assert len(created) == len(set(created)) and {line for line in lines if not line.endswith(" created")} == {
        "persistentvolumeclaim/ascend-workspace unchanged"}, out.stdout
    ours = [c for c in created if ".ascendtrain.dev/" in c]
    assert len(ours) >= 15 and "persistentvolumeclaim/ascend-workspace" in created, created
    listed = rows(kubectl(kubeconfig, "get", "atj,dsp,ckc", "-o", "name").stdout)
    assert sorted(r[0] for r in listed) == sorted(ours)


# -- pods that really run: a local cluster with one node --------------------------------------------------------

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(fast_storage=True, root=tmp_path_factory.mktemp("kubectl") / "cluster") as local:
        yield local


def wait_phase(resources, pods, name: str, phases: tuple[str, ...], timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        pod = resources.get(pods, name, "default")
        if (pod.get("status") or {}).get("phase") in phases:
            return pod
        assert time.monotonic() < deadline, pod.get("status")
        time.sleep(0.1)


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
    claim = create_workspace(cluster, "default", "work")  # the scheduler places no pod whose claim is missing
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
    assert str(claim) in raw  # the process itself ran on the host's paths


def _events_of(cluster, pod: str, want: set[str], timeout: float = 30) -> str:
    """`kubectl describe pod`'s output once its Events list every reason in ``want``."""
    deadline = time.monotonic() + timeout
    while True:
        text = kubectl(cluster, "describe", "pod", pod).stdout
        events = text.split("Events:", 1)[-1]
        if all(reason in events for reason in want) or time.monotonic() > deadline:
            return events
        time.sleep(0.3)


def test_the_local_node_posts_the_pod_lifecycle_events_a_kubelet_posts(cluster):
    code = "import time; time.sleep(30)"
    sleeper = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sleeper"}, "spec": {"restartPolicy": "Never",
               "containers": [{"name": "main", "image": "local", "command": ["python", "-c", code]}]}}
    kubectl(cluster, "apply", "-f", str(write(cluster.root, "sleeper.yaml", sleeper)))
    events = _events_of(cluster, "sleeper", {"Scheduled", "Pulled", "Created", "Started"})
    for reason, source in (("Scheduled", "default-scheduler"), ("Pulled", "kubelet"), ("Created", "kubelet"),
                           ("Started", "kubelet")):
        assert re.search(rf"Normal\s+{reason}\s+\S+\s+{source}", events), events
    order = [re.search(rf"Normal\s+{reason}\s", events).start()
             for reason in ("Scheduled", "Pulled", "Created", "Started")]
    assert order == sorted(order), events  # in the order they happened, as describe lists a kubelet's
    kubectl(cluster, "delete", "pod", "sleeper", "--wait=false")
    deadline = time.monotonic() + 20
    while "Killing" not in (seen := kubectl(cluster, "get", "events", "--field-selector",
                                            "involvedObject.name=sleeper").stdout):
        assert time.monotonic() < deadline, seen
        time.sleep(0.3)
    assert re.search(r"Normal\s+Killing\s+pod/sleeper\s+Stopping container main", seen), seen
    greedy = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "greedy"}, "spec": {
        "restartPolicy": "Never", "containers": [{"name": "main", "image": "local", "command": ["true"],
                                                  "resources": {"limits": {"huawei.com/Ascend910": "1"}}}]}}
    kubectl(cluster, "apply", "-f", str(write(cluster.root, "greedy.yaml", greedy)))
    events = _events_of(cluster, "greedy", {"FailedScheduling"})
    assert re.search(r"Warning\s+FailedScheduling\s+.*0/1 nodes are available: 1 Insufficient huawei.com/Ascend910",
                     events), events
