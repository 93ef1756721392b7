"""Training runtimes (ascend_operator.kinds.runtimes): the merge of a job over its runtime, locked fields, and the
recorded copy that restarts render from."""
import pytest
from pydantic import ValidationError

from ascend_operator.kinds import runtimes
from ascend_operator.api.runtime import TrainingRuntimeSpec
from ascend_operator.api.train_job import AscendTrainJobSpec
from ascend_operator.render.train_job import objects

TEMPLATE = {
    "image": "registry.local/ascend-engine:cann8",
    "devices": {"resource": "nvidia.com/gpu", "ringController": ""},
    "hccl": {"connectTimeout": 1800},
    "env": [{"name": "A", "value": "runtime"}, {"name": "B", "value": "runtime"}],
    "nodeSelector": {"pool": "train", "zone": "a"},
    "tolerations": [{"key": "gpu", "operator": "Exists"}],
    "securityContext": {"runAsUser": 1000},
    "terminationGracePeriodSeconds": 1800,
    "shmSize": "32Gi",
    "priorityClassName": "training",
}
RUNTIME = {"metadata": {"name": "gpu", "generation": 3}, "spec": {"template": TEMPLATE, "lockedFields": ["image"]}}


def _job(**spec):
    """A job's spec as the API server stores it: the schema's defaults filled in."""
    stored = AscendTrainJobSpec.model_validate({"runtimeRef": {"name": "gpu"}, "train": {}, **spec})
    return stored.model_dump(by_alias=True, exclude_none=True, exclude={"train"}) | {"train": {}}


def _resolve(spec, recorded=None, runtime=RUNTIME):
    return runtimes.resolve(spec, recorded, "team", lambda kind, ns, name: runtime)


def test_the_job_gets_the_runtime_settings_and_its_own_win_field_by_field():
    merged, recorded = _resolve(_job(env=[{"name": "B", "value": "job"}, {"name": "C", "value": "job"}],
                                     nodeSelector={"zone": "b"}, tolerations=[],
                                     devices={"memoryGiB": 80}, terminationGracePeriodSeconds=600))
    spec = AscendTrainJobSpec.model_validate(merged)
    assert spec.image == TEMPLATE["image"] and spec.priorityClassName == "training" and spec.shmSize == "32Gi"
    assert spec.devices.resource == "nvidia.com/gpu" and spec.devices.memoryGiB == 80  # objects merged by key
    assert spec.hccl.connectTimeout == 1800
    assert [(e.name, e.value) for e in spec.env] == [("A", "runtime"), ("B", "job"), ("C", "job")]  # env by name
    assert spec.nodeSelector == {"pool": "train", "zone": "b"}
    # a list the job leaves at its default ([]) is the runtime's; one it sets replaces the runtime's
    assert spec.tolerations == TEMPLATE["tolerations"]
    assert spec.terminationGracePeriodSeconds == 600
    assert recorded["name"] == "gpu" and recorded["generation"] == 3 and recorded["template"] == TEMPLATE
    assert recorded["hash"] == runtimes.template_hash(TEMPLATE) and recorded["kind"] == "ClusterAscendTrainingRuntime"
    pod = next(o for o in objects("j", "team", spec) if o["kind"] == "Pod")
    assert pod["spec"]["containers"][0]["image"] == TEMPLATE["image"]
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["spec"]["priorityClassName"] == "training" and pod["spec"]["terminationGracePeriodSeconds"] == 600


def test_a_replaced_list_is_the_jobs_alone():
    merged, _ = _resolve(_job(tolerations=[{"key": "spot", "operator": "Exists"}]))
    assert merged["tolerations"] == [{"key": "spot", "operator": "Exists"}]


def test_a_locked_field_is_refused_naming_the_runtime_and_the_field():
    with pytest.raises(runtimes.Refused) as refused:
        _resolve(_job(image="my/own:1"))
    assert refused.value.reason == runtimes.LOCKED
    assert "spec.image: ClusterAscendTrainingRuntime gpu locks image" in str(refused.value)
    same, _ = _resolve(_job(image=TEMPLATE["image"]))  # the runtime's own value changes nothing
    assert same["image"] == TEMPLATE["image"]


def test_a_locked_object_may_not_gain_keys():
    runtime = {**RUNTIME, "spec": {"template": TEMPLATE, "lockedFields": ["securityContext", "devices.resource"]}}
    with pytest.raises(runtimes.Refused, match="spec.securityContext: .* locks securityContext"):
        _resolve(_job(securityContext={"runAsUser": 0}), runtime=runtime)
    with pytest.raises(runtimes.Refused, match="locks devices.resource"):
        _resolve(_job(devices={"resource": "huawei.com/npu"}), runtime=runtime)
    _resolve(_job(devices={"memoryGiB": 80}), runtime=runtime)  # another key of devices is the job's to set


def test_the_recorded_copy_wins_over_the_live_runtime_and_a_deleted_one():
    _, recorded = _resolve(_job())
    edited = {"metadata": {"generation": 4}, "spec": {"template": {**TEMPLATE, "image": "registry.local/new:2"}}}
    again, new = _resolve(_job(), recorded=recorded, runtime=edited)
    assert new is None and again["image"] == TEMPLATE["image"]
    again, _ = _resolve(_job(), recorded=recorded, runtime=None)
    assert again["image"] == TEMPLATE["image"]
    fresh, snap = _resolve(_job(), runtime=edited)  # a new job sees the new runtime
    assert fresh["image"] == "registry.local/new:2" and snap["generation"] == 4


def test_a_missing_runtime_is_refused_with_how_to_find_one():
    with pytest.raises(runtimes.Refused) as refused:
        _resolve(_job(runtimeRef={"kind": "AscendTrainingRuntime", "name": "gone"}), runtime=None)
    assert refused.value.reason == runtimes.NOT_FOUND
    assert "AscendTrainingRuntime team/gone not found" in str(refused.value) and "kubectl get atr -n team" in str(
        refused.value)


def test_a_runtime_without_an_image_needs_the_job_to_give_one():
    runtime = {"metadata": {}, "spec": {"template": {"devices": {"resource": "none"}}}}
    with pytest.raises(runtimes.Refused, match="neither the job nor ClusterAscendTrainingRuntime gpu sets image"):
        _resolve(_job(), runtime=runtime)
    merged, _ = _resolve(_job(image="my/own:1"), runtime=runtime)
    assert merged["image"] == "my/own:1" and merged["devices"]["resource"] == "none"


def test_a_job_without_a_runtime_still_needs_an_image():
    with pytest.raises(ValidationError, match="image is required unless runtimeRef"):
        AscendTrainJobSpec.model_validate({"train": {}})
    assert runtimes.resolve({"image": "a:1"}, None, "ns", None) == ({"image": "a:1"}, None)


def test_a_runtime_is_validated_like_a_jobs_pod_part():
    TrainingRuntimeSpec.model_validate({"template": TEMPLATE, "lockedFields": ["image", "devices.resource"]})
    for bad, field in (({"template": {"image": "Bad Image"}}, "image"),
                       ({"template": {"terminationGracePeriodSeconds": 5}}, "terminationGracePeriodSeconds"),
                       ({"template": {"env": [{"name": "MASTER_ADDR", "value": "x"}]}}, "MASTER_ADDR"),
                       ({"lockedFields": ["train"]}, "not a runtime field")):
        with pytest.raises(ValidationError, match=field):
            TrainingRuntimeSpec.model_validate(bad)


def test_validate_refuses_a_locked_field_of_a_runtime_in_the_same_file():
    """`ascend-train validate` (validation.validate_text) checks a job against a runtime given beside it."""
    from ascend_operator.validation import validate_text

    text = """
apiVersion: ascendtrain.dev/v1alpha1
kind: ClusterAscendTrainingRuntime
metadata: {name: gpu}
spec:
  lockedFields: [image]
  template: {image: "registry.local/engine:1", devices: {resource: nvidia.com/gpu, ringController: ""}}
---
apiVersion: ascendtrain.dev/v1alpha1
kind: AscendTrainJob
metadata: {name: mine}
spec:
  runtimeRef: {name: gpu}
  image: my/own:1
  train: {}
"""
    _, problems = validate_text(text, "f.yaml")
    assert [str(p) for p in problems] == [
        'f.yaml:9: spec.runtimeRef: RuntimeFieldLocked: spec.image: ClusterAscendTrainingRuntime gpu locks image '
        '(lockedFields): the job may not change it (the runtime has "registry.local/engine:1")']
    _, problems = validate_text(text.replace("  image: my/own:1\n", ""), "f.yaml")
    assert problems == []


def test_a_dataset_prep_takes_the_pod_settings_but_not_the_devices():
    from ascend_operator.api.single_pod import DatasetPrepSpec

    prep = {"input": "/d/a.jsonl", "tokenizerNameOrPath": "/t", "outputPrefix": "/o/a"}
    stored = DatasetPrepSpec.model_validate({"runtimeRef": {"name": "gpu"}, "prep": prep}).model_dump(
        by_alias=True, exclude_none=True)
    locked = {**RUNTIME, "spec": {"template": TEMPLATE, "lockedFields": ["image", "devices.resource"]}}
    merged, recorded = runtimes.resolve(stored, None, "team", lambda *a: locked, DatasetPrepSpec)
    spec = DatasetPrepSpec.model_validate(merged)
    assert spec.image == TEMPLATE["image"] and spec.nodeSelector == TEMPLATE["nodeSelector"]
    assert spec.devices.resource == "none" and recorded["name"] == "gpu"  # one pod on CPU; the lock is not its
    with pytest.raises(runtimes.Refused, match="locks image"):
        runtimes.resolve({**stored, "image": "my/own:1"}, None, "team", lambda *a: locked, DatasetPrepSpec)
