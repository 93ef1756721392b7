"""The ways users reach the operator, for real, on one local cluster: the real `helm` installs, upgrades, rolls back
and uninstalls the chart (the node agent runs the operator Deployment's pods as it runs the engine's), and Flux's
source-controller and kustomize-controller apply jobs from a git repository served on loopback. Every job status
met on the way is read by kstatus itself (sigs.k8s.io/cli-utils) and by the chart's Argo CD health check in gopher-lua
(``gitopscheck``, controlplane/gitopscheck). docs/install.md and docs/gitops.md show these commands.

The cluster starts with no CRDs and no operator: Helm installs both, as on a real cluster."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from ascend_cluster import build
from ascend_cluster.cluster import LocalCluster

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "ascend-train-operator"
HEALTH_LUA = CHART / "files" / "argocd-health.lua"
RELEASE, RELEASE_NS = "ato", "ascend-system"
OPERATOR_SELECTOR = "app.kubernetes.io/instance=ato,app.kubernetes.io/name=ascend-train-operator"
FINALIZER = "ascendtrain.dev/pod-tracking"
# Short leases, so a takeover on this shared machine takes seconds (the defaults are client-go's 15/10/2).
FAST_LEASES = ["--set", "leaderElection.leaseDurationSeconds=4", "--set", "leaderElection.renewDeadlineSeconds=3",
               "--set", "leaderElection.retryPeriodSeconds=1", "--set", "progressInterval=2"]


class Tools:
    """helm, kubectl and gitopscheck against the cluster, each in an environment of its own (helm's config and
    cache under the test's folder)."""

    def __init__(self, cluster: LocalCluster, home: Path):
        self.cluster = cluster
        self.helm_bin = str(build.binaries(build.HELM) / "helm")
        self.check_bin = str(build.binaries(build.GITOPSCHECK) / "gitopscheck")
        self.env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig), HOME=str(home),
                        HELM_CONFIG_HOME=str(home / "helm-config"), HELM_CACHE_HOME=str(home / "helm-cache"),
                        HELM_DATA_HOME=str(home / "helm-data"))

    def run(self, *argv: str, check: bool = True, input: str | None = None, timeout: float = 300) -> str:
        out = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout, input=input)
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        return out.stdout + out.stderr

    def helm(self, *args: str, **kw: Any) -> str:
        return self.run(self.helm_bin, *args, **kw)

    def kubectl(self, *args: str, **kw: Any) -> str:
        return self.run(self.cluster.kubectl, *args, **kw)

    def get(self, kind: str, name: str, namespace: str = "default") -> dict[str, Any]:
        return json.loads(self.kubectl("get", kind, name, "-n", namespace, "-o", "json", "--show-managed-fields"))

    def kstatus(self, obj: dict[str, Any]) -> dict[str, Any]:
        return json.loads(self.run(self.check_bin, "kstatus", input=json.dumps(obj)))

    def argocd(self, obj: dict[str, Any]) -> dict[str, Any]:
        return json.loads(self.run(self.check_bin, "argocd", str(HEALTH_LUA), input=json.dumps(obj)))

    def wait(self, what: str, probe, timeout: float = 240, every: float = 1.0):
        deadline = time.monotonic() + timeout
        while True:
            got = probe()
            if got:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} within {timeout:.0f}s")
            time.sleep(every)

    def phase(self, kind: str, name: str, namespace: str = "default") -> str:
        return (self.get(kind, name, namespace).get("status") or {}).get("phase") or ""

    def operator_pods(self) -> list[dict[str, Any]]:
        return json.loads(self.kubectl("get", "pods", "-n", RELEASE_NS, "-l", OPERATOR_SELECTOR, "-o",
                                       "json"))["items"]

    def lease_holder(self) -> str:
        out = self.kubectl("get", "lease", "-n", RELEASE_NS, "ascend-train-operator", "-o", "json", check=False)
        return (json.loads(out)["spec"].get("holderIdentity") or "") if out.startswith("{") else ""


@pytest.fixture(scope="module")
def tools(tmp_path_factory):
    root = tmp_path_factory.mktemp("helm-gitops")
    with LocalCluster(root / "cluster", crds_dir=None, fast_storage=True) as cluster:
        yield Tools(cluster, root)


def _byo_job(name: str, script: str, namespace: str = "default") -> dict[str, Any]:
    """A one-pod job running a short Python program of the test's (cheap: no torch), under the operator as any
    bring-your-own trainer; its claim is the quickstart's workspace."""
    return {"apiVersion": "ascendtrain.dev/v1alpha1", "kind": "AscendTrainJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"image": "ascend-train/engine-cpu:0.1.0", "nnodes": 1, "devices": {"resource": "none"},
                     "shmSize": "none",
                     "volumes": [{"name": "workspace", "persistentVolumeClaim": {"claimName": "ascend-workspace"}}],
                     "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"}],
                     "trainer": {"command": ["python3", "-c", script], "progress": "none"}}}


def _waits_for(marker: str) -> str:
    """A program that runs until ``/workspace/<marker>`` exists (the test creates it), then exits 0."""
    return f"import os, time\nwhile not os.path.exists('/workspace/{marker}'):\n    time.sleep(0.2)\nprint('done')"


def _apply(tools: Tools, *docs: dict[str, Any]) -> None:
    tools.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))


def _pod_uids(tools: Tools, job: str) -> dict[str, str]:
    pods = json.loads(tools.kubectl("get", "pods", "-l", f"ascendtrain.dev/job-name={job}", "-o", "json"))["items"]
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}


def _verdicts(tools: Tools, kind: str, name: str) -> tuple[str, str, dict, dict]:
    obj = tools.get(kind, name)
    return obj["status"].get("phase"), obj, tools.kstatus(obj), tools.argocd(obj)


def test_helm_install_upgrade_rollback_uninstall(tools: Tools):
    """`helm install` runs the operator as a Deployment's pod and the quickstart to Succeeded; `helm upgrade` to two
    replicas with leader election after a CRD change keeps a running job running (same pod, no restart) and the new
    leader finishes it; `helm rollback` goes back to one replica; `helm uninstall` releases the pod-tracking
    finalizer of a job still running, so deleting that job afterwards leaves no pod Terminating for good."""
    out = tools.helm("install", RELEASE, str(CHART), "-n", RELEASE_NS, "--create-namespace", "--wait",
                     "--timeout", "3m", *FAST_LEASES)
    assert "STATUS: deployed" in out, out
    crds = tools.kubectl("get", "crd", "-o", "name")
    assert "ascendtrainjobs.ascendtrain.dev" in crds and "datasetpreps.ascendtrain.dev" in crds, crds
    [operator] = tools.operator_pods()
    assert operator["status"]["phase"] == "Running"
    tools.wait("no Lease holder", lambda: tools.lease_holder().startswith(operator["metadata"]["name"]))

    # The quickstart, as docs/install.md's "Run a first job" applies it; and a job whose program fails.
    tools.kubectl("apply", "-f", str(REPO / "examples" / "quickstart.yaml"))
    failing = _byo_job("bad-data", "raise SystemExit('ValueError: no dataset for prefix /workspace/data/x')")
    waiting = _byo_job("long", _waits_for("go-long"))
    _apply(tools, failing, waiting)
    tools.wait("quickstart not Succeeded", lambda: tools.phase("atj", "quickstart") in ("Succeeded", "Failed"), 400)
    tools.wait("bad-data not Failed", lambda: tools.phase("atj", "bad-data") == "Failed")
    tools.wait("long not Running", lambda: tools.phase("atj", "long") == "Running")
    phase, _, kstatus, health = _verdicts(tools, "atj", "quickstart")
    assert phase == "Succeeded" and kstatus["status"] == "Current" and health["status"] == "Healthy", \
        (kstatus, health)
    phase, failed, kstatus, health = _verdicts(tools, "atj", "bad-data")
    cause = next(c for c in failed["status"]["conditions"] if c["type"] == "Failed")["message"]
    assert "no dataset for prefix" in cause, cause
    assert kstatus["status"] == "Failed" and kstatus["message"] == cause, kstatus
    assert health == {"status": "Degraded", "message": cause, "name": "bad-data", "kind": "AscendTrainJob"}, health
    _, _, kstatus, health = _verdicts(tools, "atj", "long")
    assert kstatus["status"] == "InProgress" and health["status"] == "Progressing", (kstatus, health)
    suspended = _byo_job("held", "print('never runs')")
    suspended["spec"]["runPolicy"] = {"suspend": True}
    _apply(tools, suspended)
    tools.wait("held not Suspended", lambda: tools.phase("atj", "held") == "Suspended")
    _, _, kstatus, health = _verdicts(tools, "atj", "held")
    assert kstatus["status"] == "InProgress" and health["status"] == "Suspended", (kstatus, health)
    before = _pod_uids(tools, "long")
    assert len(before) == 1 and all(FINALIZER in (tools.get("pod", p)["metadata"].get("finalizers") or [])
                                    for p in before), before

    # Upgrade: the CRDs first (Helm never upgrades crds/), changed as a new release would change them, then the
    # release with two replicas and a rolled pod template.
    changed = tools.cluster.root.parent / "crds-next"
    changed.mkdir(exist_ok=True)
    for path in sorted((CHART / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        crd["metadata"].setdefault("annotations", {})["ascendtrain.dev/next-release"] = "true"
        for version in crd["spec"]["versions"]:
            version.setdefault("additionalPrinterColumns", []).append(
                {"name": "Observed", "type": "integer", "jsonPath": ".status.observedGeneration", "priority": 1})
        (changed / path.name).write_text(yaml.safe_dump(crd))
    applied = tools.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(changed))
    assert "serverside-applied" in applied, applied
    out = tools.helm("upgrade", RELEASE, str(CHART), "-n", RELEASE_NS, "--reuse-values", "--set", "replicas=2",
                     "--set-string", "podAnnotations.revision=2", "--wait", "--timeout", "3m")
    assert "STATUS: deployed" in out and "REVISION: 2" in out, out
    pods = tools.wait("not two new operator pods", lambda: (lambda p: p if len(p) == 2 and all(
        x["metadata"].get("annotations", {}).get("revision") == "2" and x["status"].get("phase") == "Running"
        for x in p) else None)(tools.operator_pods()), 180)
    names = {p["metadata"]["name"] for p in pods}
    tools.wait("no new leader", lambda: tools.lease_holder().split("_")[0] in names, 120)
    assert "OBSERVED" in tools.kubectl("get", "atj", "long", "-o", "wide")  # the new CRD is served
    # The running job: the same pod, never restarted; the new leader sees it end.
    (tools.cluster.root / "pvc" / "default" / "ascend-workspace" / "go-long").write_text("")
    tools.wait("long not Succeeded after the upgrade", lambda: tools.phase("atj", "long") == "Succeeded", 180)
    long = tools.get("atj", "long")
    assert long["status"].get("restarts", 0) == 0 and _pod_uids(tools, "long") == before, long["status"]

    out = tools.helm("rollback", RELEASE, "1", "-n", RELEASE_NS, "--wait", "--timeout", "3m")
    assert "Rollback was a success" in out, out
    tools.wait("not one operator pod after the rollback", lambda: len(
        [p for p in tools.operator_pods() if not p["metadata"].get("deletionTimestamp")]) == 1, 180)
    history = tools.helm("history", RELEASE, "-n", RELEASE_NS)
    assert "Rollback to 1" in history, history

    # Uninstall with a job still running: its pod holds the finalizer until the hook releases it.
    _apply(tools, _byo_job("orphan", _waits_for("go-orphan")))
    tools.wait("orphan not Running", lambda: tools.phase("atj", "orphan") == "Running")
    [orphan_pod] = _pod_uids(tools, "orphan")
    assert FINALIZER in tools.get("pod", orphan_pod)["metadata"]["finalizers"]
    out = tools.helm("uninstall", RELEASE, "-n", RELEASE_NS, "--wait", "--timeout", "3m")
    assert f'release "{RELEASE}" uninstalled' in out, out
    assert not tools.operator_pods()
    assert FINALIZER not in (tools.get("pod", orphan_pod)["metadata"].get("finalizers") or [])
    assert tools.phase("atj", "orphan") == "Running"  # jobs and CRDs stay: Helm never deletes crds/
    tools.kubectl("delete", "atj", "orphan", "--wait=false")
    tools.wait("the orphan's pod is still there", lambda: orphan_pod not in tools.kubectl(
        "get", "pods", "-o", "name"), 90)
    hook = json.loads(tools.kubectl("get", "jobs", "-n", RELEASE_NS, "-o", "json"))["items"]
    assert hook == [], hook  # the hook Job succeeded and Helm deleted it


# -- Flux -----------------------------------------------------------------------------------------------------------

GITOPS_NS = "gitops"


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-c", "user.name=ci", "-c", "user.email=ci@example.invalid", *args], cwd=repo,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _commit(work: Path, message: str, files: dict[str, Any]) -> str:
    """Write ``files`` (path -> documents, or None to remove) into the clone, commit and push; the commit's sha."""
    for name, docs in files.items():
        path = work / name
        if docs is None:
            path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(docs if isinstance(docs, str) else yaml.safe_dump_all(docs, sort_keys=False))
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "--allow-empty", "-m", message)
    _git(work, "push", "-q", "origin", "HEAD:main")
    return _git(work, "rev-parse", "HEAD")


def _kustomization(tools: Tools) -> dict[str, Any]:
    return tools.get("kustomization", "jobs", "flux-system")


def _ready(obj: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"), {})


def _reconciled(tools: Tools, sha: str, ready: str, timeout: float = 240) -> dict[str, Any]:
    """The Kustomization once it has tried ``sha`` and its Ready condition is ``ready`` (asking both controllers
    to reconcile now, as `flux reconcile` does, instead of waiting for their interval)."""
    stamp = str(time.time_ns())
    for kind, name in (("gitrepository", "jobs"), ("kustomization", "jobs")):
        tools.kubectl("annotate", "-n", "flux-system", "--overwrite", kind, name,
                      f"reconcile.fluxcd.io/requestedAt={stamp}")

    last: list[dict[str, Any]] = [{}]

    def done():
        k = last[0] = _kustomization(tools)
        status, condition = k.get("status") or {}, _ready(k)
        tried = status.get("lastAttemptedRevision", "").endswith(sha)
        return k if tried and condition.get("status") == ready and \
            status.get("lastHandledReconcileAt") == stamp else None
    try:
        return tools.wait(f"Kustomization jobs not Ready={ready} at {sha[:8]}", done, timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {json.dumps(last[0].get('status'), indent=1)}") from None


def test_flux_applies_jobs_from_git_and_waits_for_them(tools: Tools, tmp_path):
    """Flux's source-controller and kustomize-controller (built from their modules) read a git repository served
    on loopback and apply its jobs with `wait: true`: Ready once the job has Succeeded, failing on a failed job
    (kstatus reads its Stalled condition with the cause); a commit that changes nothing leaves a finished job as
    it is, a changed spec is refused by the API server as docs/operations.md says (only runPolicy may change),
    and Flux's server-side apply and the operator own disjoint fields."""
    from ascend_cluster.flux import Flux, GitServer

    tools.helm("upgrade", "--install", RELEASE, str(CHART), "-n", RELEASE_NS, "--create-namespace", "--wait",
               "--timeout", "3m", *FAST_LEASES)
    with Flux(tools.cluster.control_plane, tmp_path / "flux") as flux, GitServer(tmp_path / "git") as server:
        bare, work = tmp_path / "git" / "jobs.git", tmp_path / "work"
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
        subprocess.run(["git", "clone", "-q", str(bare), str(work)], check=True, capture_output=True)
        _git(work, "checkout", "-q", "-b", "main")
        claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                 "metadata": {"name": "ascend-workspace", "namespace": GITOPS_NS},
                 "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}}
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": GITOPS_NS}}
        hello = _byo_job("hello", "import time\ntime.sleep(3)\nprint('trained')", GITOPS_NS)
        first = _commit(work, "a namespace, its workspace and a job", {
            "jobs/namespace.yaml": [namespace, claim], "jobs/hello.yaml": [hello]})
        _apply(tools, {
            "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
            "metadata": {"name": "jobs", "namespace": "flux-system"},
            "spec": {"url": server.url("jobs"), "interval": "1m", "ref": {"branch": "main"}}}, {
            "apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
            "metadata": {"name": "jobs", "namespace": "flux-system"},
            "spec": {"interval": "1m", "retryInterval": "5s", "timeout": "2m", "path": "./jobs", "prune": True,
                     "wait": True, "sourceRef": {"kind": "GitRepository", "name": "jobs"}}})
        done = _reconciled(tools, first, "True")
        job = tools.get("atj", "hello", GITOPS_NS)
        assert job["status"]["phase"] == "Succeeded", job["status"]  # Flux was Ready only once the job was
        assert _ready(done)["reason"] == "ReconciliationSucceeded", done["status"]
        uid, finished = job["metadata"]["uid"], job["status"]["completionTime"]

        # Who owns what: Flux applies the spec (server-side apply, field manager kustomize-controller), the
        # operator writes only the status subresource; no field has two owners.
        owners = {(m["manager"], m.get("subresource", "")): m["fieldsV1"] for m in job["metadata"]["managedFields"]}
        flux_fields = [f for (manager, sub), f in owners.items() if manager == "kustomize-controller"]
        assert len(flux_fields) == 1 and "f:spec" in flux_fields[0] and "f:status" not in flux_fields[0], owners
        others = {k: f for k, f in owners.items() if k[0] != "kustomize-controller"}
        assert others and all(sub == "status" and set(f) <= {"f:status"} for (_, sub), f in others.items()), owners

        # A failing job: Flux fails fast on its kstatus Failed, the job's Stalled condition carries the cause.
        bad = _byo_job("bad", "raise SystemExit('ValueError: tokenizer has no pad token')", GITOPS_NS)
        second = _commit(work, "a job that fails", {"jobs/bad.yaml": [bad]})
        failed = _reconciled(tools, second, "False")
        message = _ready(failed)["message"]
        assert _ready(failed)["reason"] == "HealthCheckFailed", failed["status"]
        assert f"AscendTrainJob/{GITOPS_NS}/bad status: 'Failed'" in message, message
        verdict = tools.kstatus(tools.get("atj", "bad", GITOPS_NS))
        assert verdict["status"] == "Failed" and "tokenizer has no pad token" in verdict["message"], verdict

        # A commit that changes no object (the failing job pruned, a README added): the finished job is untouched.
        third = _commit(work, "remove the failing job; a README", {"jobs/bad.yaml": None,
                                                                  "README.md": "jobs for the cluster\n"})
        _reconciled(tools, third, "True")
        job = tools.get("atj", "hello", GITOPS_NS)
        assert (job["metadata"]["uid"], job["metadata"]["generation"], job["status"]["completionTime"],
                job["status"].get("restarts", 0)) == (uid, 1, finished, 0), job
        assert tools.kubectl("get", "atj", "bad", "-n", GITOPS_NS, check=False).count("NotFound") == 1

        # A changed spec is refused by the API server, naming the field; Flux reports the refusal.
        changed = _byo_job("hello", "print('trained differently')", GITOPS_NS)
        fourth = _commit(work, "change the job's command", {"jobs/hello.yaml": [changed]})
        refused = _ready(_reconciled(tools, fourth, "False"))
        assert "spec.trainer" in refused["message"] and "may not change once the job exists" in \
            refused["message"], refused
        assert tools.get("atj", "hello", GITOPS_NS)["metadata"]["generation"] == 1
        # runPolicy may change: applied, the job stays Succeeded and is not run again.
        hello["spec"]["runPolicy"] = {"ttlSecondsAfterFinished": 86400}
        _commit(work, "keep the finished job a day", {"jobs/hello.yaml": [hello]})
        for kind in ("gitrepository", "kustomization"):
            tools.kubectl("annotate", "-n", "flux-system", "--overwrite", kind, "jobs",
                          f"reconcile.fluxcd.io/requestedAt={time.time_ns()}")
        job = tools.wait("Flux did not apply the runPolicy change", lambda: (lambda j: j if j["metadata"][
            "generation"] == 2 else None)(tools.get("atj", "hello", GITOPS_NS)), 120)
        assert job["spec"]["runPolicy"]["ttlSecondsAfterFinished"] == 86400
        time.sleep(5)  # a pass of the operator's
        job = tools.get("atj", "hello", GITOPS_NS)
        assert (job["metadata"]["uid"], job["status"]["phase"], job["status"]["completionTime"]) == \
            (uid, "Succeeded", finished), job["status"]
        assert job["status"].get("observedGeneration") == 2, job["status"]  # else kstatus: InProgress for ever
        assert tools.kstatus(job)["status"] == "Current"
