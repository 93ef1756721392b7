"""What you apply is what is stored, whichever way you apply it: every example and every complete resource in docs/
goes through `ascend-train apply`, `kubectl get -o json`, a re-apply of both, client-side `kubectl apply` and
`kubectl apply --server-side`, and the stored spec never changes (issue 26: a CPU job turned into an Ascend job
because a null on a defaulted field is removed by a merge patch and defaulted again).

One cluster for all of them: each example file gets a namespace of its own, so examples that reuse a name with
another spec never meet. No operator and no engine run: the operator's own rendering turns each stored spec into
the pods it would create.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from ascend_operator.handlers import lifecycle, single_pod, train_job  # noqa: F401 -- registers the job kinds
from ascend_operator.render import single_pod as single_pod_render
from ascend_operator.local import core_schemas
from ascend_train.cli import main as ascend_train
from ascend_cluster.cluster import LocalCluster
from ascend_operator.local.pod_validation import pod_spec_errors
from test_kubectl import kubectl, pytestmark  # noqa: F401 -- the same kubectl binary and skip conditions

REPO = Path(__file__).resolve().parents[2]


def _documents() -> dict[str, list[dict]]:
    """Example file or docs block -> its resources of our API group, each placed in the namespace of its source."""
    sources = {f"examples/{p.name}": p.read_text() for p in sorted((REPO / "examples").glob("*.yaml"))}
    for page in sorted((REPO / "docs").glob("*.md")):
        for index, block in enumerate(re.findall(r"```ya?ml\n(.*?)```", page.read_text(), re.S)):
            sources[f"docs/{page.name}#{index}"] = block
    out = {}
    for number, (source, text) in enumerate(sources.items()):
        docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)
                and str(d.get("apiVersion", "")).startswith("ascendtrain.dev/")]
        for doc in docs:  # a docs block that is a fragment (no apiVersion/kind) is not a resource
            doc.setdefault("metadata", {})["namespace"] = f"rt{number}"
        if docs:
            out[source] = docs
    return out


DOCUMENTS = _documents()


@pytest.fixture(scope="module")
def applied(tmp_path_factory):
    """A cluster holding every document, created by `ascend-train apply`; yields (cluster, file, stored specs)."""
    root = tmp_path_factory.mktemp("roundtrip")
    with LocalCluster(root=root / "cluster") as cluster:
        namespaces = sorted({d["metadata"]["namespace"] for docs in DOCUMENTS.values() for d in docs})
        everything = root / "all.yaml"
        everything.write_text(yaml.safe_dump_all(
            [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in namespaces]
            + [d for docs in DOCUMENTS.values() for d in docs], sort_keys=False))
        assert ascend_train(["--root", str(cluster.root), "apply", "-f", str(everything)]) == 0
        yield cluster, everything, _stored(cluster, everything)


def _stored(cluster: LocalCluster, path: Path) -> dict[tuple[str, str, str], dict]:
    listed = json.loads(kubectl(cluster, "get", "-f", str(path), "-o", "json").stdout)
    return {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]): o
            for o in listed["items"] if o["kind"] != "Namespace"}


def _stored_now(cluster: LocalCluster) -> dict[tuple[str, str, str], dict]:
    """The same objects read with the project's own client (quicker than a kubectl process per check)."""
    resources = cluster.client()
    try:
        found = {}
        for kind in ("atj", "dsp", "ckc"):
            for obj in resources.list(resources.resolve(kind), None):
                found[(obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj
        return found
    finally:
        resources.close()


def _specs(objects: dict) -> dict:
    return {key: (obj["spec"], obj["metadata"]["generation"]) for key, obj in objects.items()}


def test_every_example_keeps_its_spec_through_every_kind_of_apply(applied, capsys):
    cluster, everything, first = applied
    assert len(first) == sum(len(d) for d in DOCUMENTS.values())
    expected = _specs(first)
    assert all(generation == 1 for _, generation in expected.values())
    got = cluster.root / "got.yaml"  # what `kubectl get -o json` printed, applied back as it is
    got.write_text(yaml.safe_dump_all(list(first.values()), sort_keys=False))
    steps = [
        ("ascend-train apply (again)", lambda: ascend_train(["--root", str(cluster.root), "apply", "-f", str(everything)])),
        ("ascend-train apply of kubectl get -o json", lambda: ascend_train(["--root", str(cluster.root), "apply", "-f", str(got)])),
        ("kubectl apply", lambda: kubectl(cluster, "apply", "-f", str(everything))),
        ("kubectl apply --server-side", lambda: kubectl(cluster, "apply", "--server-side", "-f", str(everything))),
        ("kubectl apply (after server-side)", lambda: kubectl(cluster, "apply", "-f", str(everything))),
    ]
    for what, step in steps:
        result = step()
        assert result == 0 or getattr(result, "returncode", 1) == 0, what
        now = _specs(_stored_now(cluster))
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


def test_cpu_jobs_pods_request_no_accelerator_after_every_apply(applied):
    cluster, everything, _ = applied
    kinds = {k.kind.kind: k for k in lifecycle._KINDS.values()}
    cpu_jobs = 0
    for (kind, namespace, name), obj in _stored(cluster, everything).items():
        job = kinds[kind]
        spec = job.spec_model.model_validate(obj["spec"])  # as the operator parses the stored object
        if kind == "AscendTrainJob":
            rendered = job.render(name, namespace, spec)
        else:  # the pod alone: a CheckpointConvert's engine config needs its trainJobRef resolved first
            rendered = [single_pod_render.pod(kind, name, spec, "convert")]
        for child in rendered:  # what the operator would send is what kube-apiserver 1.32 accepts, unpruned
            group, _, version = child["apiVersion"].rpartition("/")
            checked = core_schemas.check(group, version, child["kind"], child)
            assert (checked.errors, checked.unknown) == ([], []), (kind, name, child["kind"])
            assert child["kind"] != "Pod" or pod_spec_errors(child) == [], (kind, name)
        requested = _extended_resources(rendered)
        if obj["spec"]["devices"]["resource"] == "none":
            cpu_jobs += 1
            assert requested == set(), (kind, namespace, name)
        else:
            assert requested == {obj["spec"]["devices"]["resource"]}, (kind, namespace, name)
    assert cpu_jobs >= 8  # quickstart and the three CPU pipelines


def test_server_side_apply_owns_fields_removes_dropped_ones_and_reports_conflicts(applied):
    cluster, _, _ = applied
    path = cluster.root / "ssa.yaml"
    job = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    job["metadata"] = {"name": "ssa", "namespace": "default", "labels": {"team": "a"}}
    job["spec"]["runPolicy"] = {"backoffLimit": 2}  # runPolicy: the part of a started job's spec that may change
    path.write_text(yaml.safe_dump(job))
    assert "serverside-applied" in kubectl(cluster, "apply", "--server-side", "-f", str(path)).stdout
    stored = json.loads(kubectl(cluster, "get", "atj", "ssa", "-o", "json", "--show-managed-fields").stdout)
    assert [e["manager"] for e in stored["metadata"]["managedFields"]] == ["kubectl"]
    assert stored["spec"]["shmSize"] == "none" and stored["spec"]["devices"]["ringController"]  # applied; defaulted
    del job["metadata"]["labels"]  # left out of the next apply: the manager gave it up, the server removes it
    path.write_text(yaml.safe_dump(job))
    kubectl(cluster, "apply", "--server-side", "-f", str(path))
    assert "labels" not in json.loads(kubectl(cluster, "get", "atj", "ssa", "-o", "json").stdout)["metadata"]
    job["spec"]["runPolicy"]["backoffLimit"] = 5  # another manager wants another value of a field kubectl owns
    path.write_text(yaml.safe_dump(job))
    clash = kubectl(cluster, "apply", "--server-side", "--field-manager=other", "-f", str(path), check=False)
    assert clash.returncode != 0 and 'conflict with "kubectl"' in clash.stderr, clash.stderr
    assert ".spec.runPolicy.backoffLimit" in clash.stderr, clash.stderr
    kubectl(cluster, "apply", "--server-side", "--field-manager=other", "--force-conflicts", "-f", str(path))
    assert json.loads(kubectl(cluster, "get", "atj", "ssa", "-o", "json").stdout)["spec"]["runPolicy"][
        "backoffLimit"] == 5
