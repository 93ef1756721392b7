"""Malformed and hostile custom objects against the session's kube-apiserver with the generated CRDs installed,
sent the way `ascend-train apply` sends them (fieldValidation=Strict): each is rejected with a message that names
the field and says why, or accepted when it is fine. Prints the rejected / accepted counts."""
from __future__ import annotations

import copy
import itertools

import pytest
import yaml

from ascend_cluster.resource_client import ApiRequestError, ResourceClient

pytestmark = pytest.mark.operator

SECRET_ENV = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}


_NAMES = itertools.count()


def atj(name=None, **spec):
    """An AscendTrainJob with a name of its own (each case is a create, never a patch of an earlier case)."""
    name = name or f"job-{next(_NAMES)}"
    body = {"image": "engine:test", "nnodes": 2, "nprocPerNode": 1,
            "train": {"parallel": {"tensorModelParallelSize": 2}}}
    for path, value in spec.items():  # "train__parallel__x" -> train.parallel.x
        node = body
        *parents, leaf = path.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return {"apiVersion": "ascendtrain.dev/v1alpha1", "kind": "AscendTrainJob", "metadata": {"name": name},
            "spec": body}


def single(kind, name, spec):
    return {"apiVersion": "ascendtrain.dev/v1alpha1", "kind": kind, "metadata": {"name": name},
            "spec": {"image": "engine:test", **spec}}


PREP = {"prep": {"input": "/data/raw.jsonl", "outputPrefix": "/data/out", "tokenizerNameOrPath": "/tok"}}
CONVERT = {"convert": {"loadModelType": "hf", "saveModelType": "mg", "loadDir": "/hf", "saveDir": "/mg"}}

# (case, object, None when it must be accepted, else substrings the server's message must contain)
CASES = [
    ("fine", atj(), None),
    ("secret env, envFrom and secret volume", atj(env=[SECRET_ENV], envFrom=[{"secretRef": {"name": "s3"}}],
                                                  volumes=[{"name": "creds", "secret": {"secretName": "s3"}}]), None),
    ("generated name", {**atj(), "metadata": {"generateName": "sweep-"}}, None),
    ("longest name for nnodes 100", atj("a" * 60, nnodes=100, train__training={"globalBatchSize": 50}), None),
    ("upper case name", atj("Llama-SFT"), ["metadata.name", "DNS-1035 label", "headless Service"]),
    ("name starting with a digit", atj("7b-sft"), ["metadata.name", "DNS-1035 label"]),
    ("name with a dot", atj("qwen2.5-sft"), ["metadata.name", "DNS-1035 label"]),
    ("name too long for nnodes 2", atj("a" * 62), ["metadata.name", "may have at most 61 characters"]),
    ("name too long for nnodes 100", atj("a" * 61, nnodes=100), ["with nnodes 100 the name may have at most 60"]),
    ("DatasetPrep name over 63", single("DatasetPrep", "p" * 64, PREP), ["metadata.name", "at most 63"]),
    ("CheckpointConvert name with underscore", single("CheckpointConvert", "to_mcore", CONVERT),
     ["metadata.name", "RFC 1123 subdomain"]),
    ("MASTER_ADDR in env", atj(env=[{"name": "MASTER_ADDR", "value": "evil"}]),
     ["spec.env: Forbidden", "env MASTER_ADDR is set by the operator"]),
    ("WORLD_SIZE in env", atj(env=[{"name": "A", "value": "1"}, {"name": "WORLD_SIZE", "value": "64"}]),
     ["env WORLD_SIZE"]),
    ("PET_NNODES in env", atj(env=[{"name": "PET_NNODES", "value": "9"}]), ["env PET_NNODES"]),
    ("RANK in a DatasetPrep", single("DatasetPrep", "prep", {**PREP, "env": [{"name": "RANK", "value": "0"}]}),
     ["env RANK"]),
    ("value and valueFrom", atj(env=[{**SECRET_ENV, "value": "leak"}]), ["may not have both value and valueFrom"]),
    ("misspelt tensorModelParalelSize", atj(train__parallel__tensorModelParalelSize=2),
     ['strict decoding error: unknown field "spec.train.parallel.tensorModelParalelSize"']),
    ("unknown top-level field", atj(replicas=4), ['unknown field "spec.replicas"']),
    ("nnodes as a string", atj(nnodes="two"),
     ['spec.nnodes: Invalid value: "string"', "some validation rules were not checked"]),
    ("nnodes 0", atj(nnodes=0), ["spec.nnodes", "greater than or equal to 1"]),
    ("world size not divisible by TP", atj(nnodes=1, nprocPerNode=3), ["divisible by"]),
    ("bad imagePullPolicy", atj(imagePullPolicy="Sometimes"), ['spec.imagePullPolicy: Unsupported value']),
    ("no image", {**atj(), "spec": {k: v for k, v in atj()["spec"].items() if k != "image"}},
     ["spec.image: Required value"]),
    ("no train block", {**atj(), "spec": {"image": "x", "nnodes": 1}}, ["spec.train: Required value"]),
    ("privileged masterPort", atj(masterPort=80), ["spec.masterPort", "greater than or equal to 1024"]),
    ("datasetPrepRef with dataPath", atj(datasetPrepRef="prep", train__data__dataPath=["/d"]),
     ["datasetPrepRef and train.data.dataPath exclude each other"]),
    ("volcanoQueue without volcano", atj(volcanoQueue="q"), ["volcanoQueue needs gangScheduling: volcano"]),
    ("negative backoffLimit", atj(runPolicy={"backoffLimit": -1}), ["spec.runPolicy.backoffLimit"]),
    # Found by applying hostile objects with kubectl: each was accepted and failed later (in the pod, the kubelet or
    # the operator's parsing, which retried with no condition) or ran other than written.
    ("image the runtime cannot parse", atj(image="ascend/éngine:1"), ["spec.image: Invalid value", "should match"]),
    ("image with an inner newline", atj(image="engine\n:1"), ["spec.image: Invalid value"]),
    ("env name with a newline", atj(env=[{"name": "A\nB", "value": "1"}]), ["spec.env[0].name", "should match"]),
    ("env name with a space (1.32 allows it)", atj(env=[{"name": "MY VAR", "value": "é ✓\nline"}]), None),
    ("env value with a NUL byte", atj(env=[{"name": "A", "value": "a\x00b"}]), ["spec.env[0].value: Invalid value"]),
    ("trainer argument with a NUL byte", {**atj(), "spec": {"image": "x", "trainer": {"command": ["torchrun"],
                                                                                        "args": ["a\x00b"]}}},
     ["spec.trainer.args[0]: Invalid value"]),
    # JSON numbers as kube-apiserver decodes them: an integral float passes the schema's integer type but stays a
    # float64, which the CEL rules that read the field refuse; past int64 it is a float64, which no integer field
    # takes (it was stored as written).
    ("nnodes written as 2.0", atj(nnodes=2.0), ["invalid data, expected int, got float64 evaluating rule"]),
    ("trainIters past int64", atj(train__training={"trainIters": 2 ** 63}),
     ['spec.train.training.trainIters: Invalid value: "number"', "must be of type integer"]),
    ("metricsPort is masterPort", atj(masterPort=9400), ["spec.train.observability.metricsPort: Invalid value",
                                                          "metricsPort and masterPort must differ"]),
    ("metricsPort is masterPort with hostNetwork (ports assigned)", atj(masterPort=9400, hostNetwork=True), None),
    ("the same env name twice", atj(env=[{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]),
     ['spec.env[1]: Duplicate value: {"name":"A"}']),
    ("valueFrom with no source", atj(env=[{"name": "T", "valueFrom": {}}]),
     ["spec.env[0].valueFrom", "should have at least 1 properties"]),
    ("cpu that is not a quantity", atj(resources={"requests": {"cpu": "lots"}}),
     ["spec.resources.requests.cpu: Invalid value: \"lots\"", "should match"]),
    ("negative memory limit", atj(resources={"limits": {"memory": "-1Gi"}}), ["spec.resources.limits.memory"]),
    ("shmSize that is not a quantity", atj(shmSize="16Gigs"), ["spec.shmSize", "should match"]),
    ("shmSize none", atj(shmSize="none"), None),
    ("global batch not a multiple of micro x DP", atj(nnodes=10, train__training={"globalBatchSize": 4,
                                                                                   "microBatchSize": 2}),
     ["spec.train.training.globalBatchSize", "(4) must be a multiple of microBatchSize x data-parallel size = 2 x 5"]),
    ("service account not a DNS name", atj(serviceAccountName="UpperCase"), ["spec.serviceAccountName"]),
    ("pull secret not a DNS name", atj(imagePullSecrets=["Bad Name"]), ["spec.imagePullSecrets[0]"]),
    ("label value over 63", {**atj(), "metadata": {"name": "labelled", "labels": {"team": "x" * 64}}},
     ["metadata.labels", "must be no more than 63 bytes"]),
    ("annotations over 256 KiB", {**atj(), "metadata": {"name": "noted", "annotations": {"a": "x" * (1 << 18)}}},
     ["metadata.annotations: Too long: may not be more than 262144 bytes"]),
]


@pytest.fixture
def resources(kubeconfig):
    with ResourceClient(kubeconfig) as r:
        yield r


def test_admission_suite(resources, namespace):
    rejected, accepted, wrong = 0, 0, []
    for case, obj, expected in CASES:
        try:
            if obj["metadata"].get("name"):
                resources.apply(copy.deepcopy(obj), namespace)
            else:  # generateName: a plain create, as `kubectl create` sends it
                resources.request("POST", resources.for_object(obj).path(namespace), obj, {"fieldValidation": "Strict"})
            outcome = None
            accepted += 1
        except ApiRequestError as exc:
            outcome = exc.message
            rejected += 1
            assert exc.status in (400, 422), (case, exc.status, exc.message)
        if expected is None and outcome is not None:
            wrong.append(f"{case}: rejected: {outcome}")
        elif expected is not None and (outcome is None or not all(s in outcome for s in expected)):
            wrong.append(f"{case}: expected {expected}, got {outcome!r}")
    print(f"admission suite: {len(CASES)} objects, {rejected} rejected, {accepted} accepted "
          f"({sum(e is None for *_, e in CASES)} expected to pass)")
    assert not wrong, "\n".join(wrong)
    assert len(CASES) >= 20


def test_ascend_train_apply_is_strict_by_default(kubeconfig, namespace, capsys):
    from ascend_train.cli import main

    manifest = kubeconfig.parent / "typo.yaml"
    manifest.write_text(yaml.safe_dump(atj("typo", train__parallel__tensorModelParalelSize=2)))
    cli = ["--root", str(kubeconfig.parent), "apply", "-f", str(manifest), "-n", namespace]
    assert main(cli) == 1
    assert 'strict decoding error: unknown field "spec.train.parallel.tensorModelParalelSize"' in \
        capsys.readouterr().err
    assert main([*cli, "--validate=warn"]) == 0
