"""Malformed and hostile custom objects against the loopback API server with the generated CRDs installed, sent
the way `ascend-train apply` sends them (fieldValidation=Strict): each is rejected with a message that names the
field and says why, or accepted when it is fine. Prints the rejected / accepted counts."""
from __future__ import annotations

import copy
import json
import itertools

import pytest
import yaml
from kubernetes import client

from ascend_cluster.resource_client import ApiRequestError, ResourceClient
from test_operator_train_job import CRDS

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
    # JSON numbers as kube-apiserver decodes them: an integral float is an integer; past int64 it is a float64,
    # which no integer field takes (it was stored as written).
    ("nnodes written as 2.0", atj(nnodes=2.0), None),
    ("trainIters past int64", atj(train__training={"trainIters": 2 ** 63}),
     ['spec.train.training.trainIters: Invalid value: "number"', "must be of type integer"]),
    ("metricsPort is masterPort", atj(masterPort=9400), ["spec.train.observability.metricsPort: Invalid value",
                                                          "metricsPort and masterPort must differ"]),
    ("metricsPort is masterPort with hostNetwork (ports assigned)", atj(masterPort=9400, hostNetwork=True), None),
    ("the same env name twice", atj(env=[{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]),
     ['spec.env[1]: Duplicate value: map[string]interface {}{"name":"A"}']),
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
     ["metadata.labels", "must be no more than 63 characters"]),
    ("annotations over 256 KiB", {**atj(), "metadata": {"name": "noted", "annotations": {"a": "x" * (1 << 18)}}},
     ["metadata.annotations: Too long: must have at most 262144 bytes"]),
]


@pytest.fixture
def resources(local_api, api_client, tmp_path):
    ext = client.ApiextensionsV1Api(api_client)
    for path in sorted(CRDS.glob("*.yaml")):
        ext.create_custom_resource_definition(yaml.safe_load(path.read_text()))
    r = ResourceClient(tmp_path / "kubeconfig")
    yield r
    r.close()


def test_admission_suite(resources):
    rejected, accepted, wrong = 0, 0, []
    for case, obj, expected in CASES:
        try:
            if obj["metadata"].get("name"):
                resources.apply(copy.deepcopy(obj))
            else:  # generateName: a plain create, as `kubectl create` sends it
                resources.request("POST", resources.for_object(obj).path("default"), obj, {"fieldValidation": "Strict"})
            outcome = None
            accepted += 1
        except ApiRequestError as exc:
            outcome = exc.message
            rejected += 1
            assert exc.status in (400, 422), (case, exc.status)
        if expected is None and outcome is not None:
            wrong.append(f"{case}: rejected: {outcome}")
        elif expected is not None and (outcome is None or not all(s in outcome for s in expected)):
            wrong.append(f"{case}: expected {expected}, got {outcome!r}")
    print(f"admission suite: {len(CASES)} objects, {rejected} rejected, {accepted} accepted "
          f"({sum(e is None for *_, e in CASES)} expected to pass)")
    assert not wrong, "\n".join(wrong)
    assert len(CASES) >= 20


def test_warn_and_ignore_store_the_pruned_object(resources, api_client):
    """fieldValidation Warn (a server's default) answers with a Warning header; Ignore is silent; both prune."""
    r = resources.for_object(atj())
    api = resources.api
    for directive, name in (("Warn", "warned"), ("Ignore", "ignored")):
        response = api.call_api("POST", api.configuration.host + r.path("default") + f"?fieldValidation={directive}",
                                header_params={"Content-Type": "application/json", "Accept": "application/json"},
                                body=atj(name, train__parallel__tensorModelParalelSize=2))
        response.read()
        warnings = response.getheaders().get("Warning")
        if directive == "Warn":
            assert warnings == '299 - "unknown field \\"spec.train.parallel.tensorModelParalelSize\\""'
        else:
            assert warnings is None
        stored = resources.get(r, name, "default")
        assert "tensorModelParalelSize" not in stored["spec"]["train"]["parallel"]
    with pytest.raises(ApiRequestError) as bad:
        resources.request("POST", r.path("default"), atj("x"), {"fieldValidation": "Loose"})
    assert bad.value.status == 400 and 'fieldValidation: Unsupported value: "Loose"' in bad.value.message


def test_pod_service_and_configmap_names_are_checked_like_kube_apiserver(local_api, api_client):
    core = client.CoreV1Api(api_client)
    cases = [
        (lambda: core.create_namespaced_service("default", {"metadata": {"name": "7up"}, "spec": {"ports": []}}),
         'Service "7up" is invalid: metadata.name: Invalid value: "7up": a DNS-1035 label must consist of lower '
         "case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric "
         "character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"),
        (lambda: core.create_namespaced_config_map("default", {"metadata": {"name": "Cfg_1"}}),
         'ConfigMap "Cfg_1" is invalid: metadata.name: Invalid value: "Cfg_1": a lowercase RFC 1123 subdomain'),
        (lambda: core.create_namespaced_pod("default", {"metadata": {"name": "p" * 254}, "spec": {"containers": []}}),
         "metadata.name: Invalid value: \"" + "p" * 254 + '": must be no more than 253 characters'),
        (lambda: core.create_namespaced_pod("default", {"metadata": {"name": "ok"},
                                                        "spec": {"hostname": "h" * 64, "containers": []}}),
         'spec.hostname: Invalid value: "' + "h" * 64 + '": must be no more than 63 characters'),
    ]
    for create, message in cases:
        with pytest.raises(client.ApiException) as err:
            create()
        status = json.loads(err.value.body)
        assert err.value.status == 422 and status["reason"] == "Invalid" and message in status["message"], status
    core.create_namespaced_config_map("default", {"metadata": {"name": "llm.v1-config"}})  # dots are fine here


def test_ascend_train_apply_is_strict_by_default(resources, tmp_path, capsys):
    from ascend_operator.local import cli

    manifest = tmp_path / "typo.yaml"
    manifest.write_text(yaml.safe_dump(atj("typo", train__parallel__tensorModelParalelSize=2)))
    assert cli.main(["--root", str(tmp_path), "apply", "-f", str(manifest)]) == 1
    assert 'strict decoding error: unknown field "spec.train.parallel.tensorModelParalelSize"' in \
        capsys.readouterr().err
    assert cli.main(["--root", str(tmp_path), "apply", "-f", str(manifest), "--validate=warn"]) == 0
