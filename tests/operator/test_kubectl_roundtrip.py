"""What you apply is what is stored, whichever way you apply it: every example and every complete resource in docs/
goes through `ascend-train apply`, `kubectl get -o json`, a re-apply of both, client-side `kubectl apply` and
`kubectl apply --server-side`, and the stored spec never changes (issue 26: a CPU job turned into an Ascend job
because a null on a defaulted field is removed by a merge patch and defaulted again).

The session's control plane for all of them: each example file gets a namespace of its own, so examples that
reuse a name with another spec never meet. No operator and no engine run: the operator's own rendering turns each
stored spec into the objects it would create, which kube-apiserver accepts (a server-side dry run).
"""
from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest
import yaml

from ascend_cluster.controlplane import write_kubeconfig
from ascend_cluster.resource_client import ResourceClient
from ascend_operator.lifecycle.kinds import KINDS
from ascend_operator.kinds import single_pod, train_job
from ascend_operator.render import single_pod as single_pod_render
from ascend_train.cli import main as ascend_train
from test_kubectl import job_named, kubectl, pytestmark, write  # noqa: F401 -- the same kubectl and marks
from test_manifests_on_the_server import dry_run

REPO = Path(__file__).resolve().parents[2]


def _documents(prefix: str) -> dict[str, list[dict]]:
    """Example file or docs block -> its resources of our API group, each placed in the namespace of its source
    (``<prefix>-<number>``)."""
    sources = {f"examples/{p.name}": p.read_text() for p in sorted((REPO / "examples").glob("*.yaml"))}
    for page in sorted((REPO / "docs").glob("*.md")):
        for index, block in enumerate(re.findall(r"```ya?ml\n(.*?)```", page.read_text(), re.S)):
            sources[f"docs/{page.name}#{index}"] = block
    out = {}
    for number, (source, text) in enumerate(sources.items()):
        # Training runtimes (docs/runtimes.md) and the jobs that name one are another test's
        # (tests/operator/test_operator_runtimes.py): a job's image may come from its runtime.
        docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)
                and str(d.get("apiVersion", "")).startswith("ascendtrain.dev/")
                and not str(d.get("kind", "")).endswith("TrainingRuntime")
                and not (d.get("spec") or {}).get("runtimeRef")]
        for doc in docs:  # a docs block that is a fragment (no apiVersion/kind) is not a resource
            doc.setdefault("metadata", {})["namespace"] = f"{prefix}-{number}"
        if docs:
            out[source] = docs
    return out


@pytest.fixture(scope="module")
def applied(control_plane, tmp_path_factory):
    """Every document created by `ascend-train apply` on the session's control plane, in namespaces of this
    module; yields (kubeconfig, file, stored objects)."""
    root = tmp_path_factory.mktemp("roundtrip")
    admin = control_plane.pki.issue("admin", "kubernetes-admin", ("system:masters",))
    kubeconfig = write_kubeconfig(root / "kubeconfig", control_plane.server, control_plane.pki.ca.cert,
                                  "kubernetes-admin", admin)
    documents = _documents(f"rt-{uuid.uuid4().hex[:5]}")
    namespaces = sorted({d["metadata"]["namespace"] for docs in documents.values() for d in docs})
    everything = root / "all.yaml"
    everything.write_text(yaml.safe_dump_all(
        [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in namespaces]
        + [d for docs in documents.values() for d in docs], sort_keys=False))
    try:
        assert ascend_train(["--root", str(root), "apply", "-f", str(everything)]) == 0
        yield kubeconfig, everything, _stored(kubeconfig, everything)
    finally:
        for name in namespaces:
            control_plane.request(f"/api/v1/namespaces/{name}", "DELETE")


def _stored(kubeconfig: Path, path: Path) -> dict[tuple[str, str, str], dict]:
    listed = json.loads(kubectl(kubeconfig, "get", "-f", str(path), "-o", "json").stdout)
    return {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]): o
            for o in listed["items"] if o["kind"] != "Namespace"}


def _stored_now(kubeconfig: Path, keys) -> dict[tuple[str, str, str], dict]:
    """The same objects read with the project's own client (quicker than a kubectl process per check)."""
    namespaces = {namespace for _, namespace, _ in keys}
    with ResourceClient(kubeconfig) as resources:
        found = {}
        for kind in ("atj", "dsp", "ckc"):
            for obj in resources.list(resources.resolve(kind), None):
                if obj["metadata"]["namespace"] in namespaces:
                    found[(obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj
        return found


def _specs(objects: dict) -> dict:
    """Each object's stored spec. (Not its generation: kube-apiserver counts a re-sent integral float, such as the
    examples' ``temperature: 1.0``, as a change of the integer it stored, though the spec reads the same.)"""
    return {key: obj["spec"] for key, obj in objects.items()}


def test_every_example_keeps_its_spec_through_every_kind_of_apply(applied, capsys):
    kubeconfig, everything, first = applied
    assert len(first) == len([d for d in yaml.safe_load_all(everything.read_text()) if d["kind"] != "Namespace"])
    assert all(obj["metadata"]["generation"] == 1 for obj in first.values())
    expected = _specs(first)
    root = kubeconfig.parent
    got = root / "got.yaml"  # what `kubectl get -o json` printed, applied back as it is
    got.write_text(yaml.safe_dump_all(list(first.values()), sort_keys=False))
    steps = [
        ("ascend-train apply (again)", lambda: ascend_train(["--root", str(root), "apply", "-f", str(everything)])),
        ("ascend-train apply of kubectl get -o json",
         lambda: ascend_train(["--root", str(root), "apply", "-f", str(got)])),
        ("kubectl apply", lambda: kubectl(kubeconfig, "apply", "-f", str(everything))),
        ("kubectl apply --server-side", lambda: kubectl(kubeconfig, "apply", "--server-side", "-f", str(everything))),
        ("kubectl apply (after server-side)", lambda: kubectl(kubeconfig, "apply", "-f", str(everything))),
    ]
    for what, step in steps:
        result = step()
        assert result == 0 or getattr(result, "returncode", 1) == 0, what
        now = _specs(_stored_now(kubeconfig, expected))
        changed = [key for key in expected if now[key] != expected[key]]
        assert not changed, f"{what} changed {changed[:3]}: {now[changed[0]]} != {expected[changed[0]]}"
    capsys.readouterr()


def _extended_resources(objects: list[dict]) -> set[str]:
    """The extended resources (names with a '/') the rendered pods request or limit."""
    names = set()
    for obj in objects:
        if obj.get("kind") != "Pod":
            continue
        for container in obj["spec"]["containers"]:
            for part in ("requests", "limits"):
                names |= {r for r in (container.get("resources") or {}).get(part) or {} if "/" in r}
    return names


def test_cpu_jobs_pods_request_no_accelerator_after_every_apply(applied, control_plane):
    kubeconfig, everything, _ = applied
    kinds = dict(KINDS)
    cpu_jobs = 0
    for (kind, namespace, name), obj in _stored(kubeconfig, everything).items():
        job = kinds[kind]
        spec = job.spec_model.model_validate(obj["spec"])  # as the operator parses the stored object
        if kind == "AscendTrainJob":
            rendered = job.render(name, namespace, spec)
        else:  # the pod alone: a CheckpointConvert's engine config needs its trainJobRef resolved first
            rendered = [single_pod_render.pod(kind, name, spec, "convert")]
        for child in rendered:  # what the operator would send, kube-apiserver accepts as it is
            _, refused = dry_run(control_plane, namespace, child)
            assert refused is None, (kind, namespace, name, child["kind"], refused)
        requested = _extended_resources(rendered)
        if spec.devices.resource == "none":
            cpu_jobs += 1
            assert requested == set(), (kind, namespace, name)
        else:
            assert requested == {spec.devices.resource}, (kind, namespace, name)
    assert cpu_jobs >= 8  # quickstart and the three CPU pipelines


def test_server_side_apply_owns_fields_removes_dropped_ones_and_reports_conflicts(kubeconfig, tmp_path):
    job = job_named("ssa")
    job["metadata"]["labels"] = {"team": "a"}
    job["spec"]["runPolicy"] = {"backoffLimit": 2}  # runPolicy: the part of a started job's spec that may change
    path = write(tmp_path, "ssa.yaml", job)
    assert "serverside-applied" in kubectl(kubeconfig, "apply", "--server-side", "-f", str(path)).stdout

    def stored(*flags: str) -> dict:
        return json.loads(kubectl(kubeconfig, "get", "atj", "ssa", "-o", "json", *flags).stdout)

    managed = stored("--show-managed-fields")
    assert [e["manager"] for e in managed["metadata"]["managedFields"]] == ["kubectl"]
    assert managed["spec"]["shmSize"] == "none"  # applied
    assert managed["spec"]["masterPort"] == 29500  # defaulted: a CEL rule reads it (fields no rule reads are not)
    del job["metadata"]["labels"]  # left out of the next apply: the manager gave it up, the server removes it
    write(tmp_path, "ssa.yaml", job)
    kubectl(kubeconfig, "apply", "--server-side", "-f", str(path))
    assert "labels" not in stored()["metadata"]
    job["spec"]["runPolicy"]["backoffLimit"] = 5  # another manager wants another value of a field kubectl owns
    write(tmp_path, "ssa.yaml", job)
    clash = kubectl(kubeconfig, "apply", "--server-side", "--field-manager=other", "-f", str(path), check=False)
    assert clash.returncode != 0 and 'conflict with "kubectl"' in clash.stderr, clash.stderr
    assert ".spec.runPolicy.backoffLimit" in clash.stderr, clash.stderr
    kubectl(kubeconfig, "apply", "--server-side", "--field-manager=other", "--force-conflicts", "-f", str(path))
    assert stored()["spec"]["runPolicy"]["backoffLimit"] == 5
