"""An AscendTrainJob without `train` only evaluates an existing checkpoint: its pods run `torchrun ... evaluate`
alone, its ConfigMap holds the EvaluateConfig alone, and the CRD's CEL rules refuse what the model refuses."""
import pytest
import yaml
from pydantic import ValidationError

from ascend_operator.api.crdgen import render_all
from ascend_operator.api.train_job import AscendTrainJobSpec
from ascend_operator.local.crd_schema import CustomResourceSchema
from ascend_operator.render import train_job as render

EVALUATION = {"task": ["mmlu"], "taskDataPath": ["/data/mmlu/test"], "tokenizerNameOrPath": "/models/qwen3",
              "load": "/models/qwen3", "tensorModelParallelSize": 2}


def _spec(**overrides):
    return {"image": "engine:1", "nnodes": 2, "nprocPerNode": 2, "evaluation": dict(EVALUATION), **overrides}


def _cel_refusals(spec: dict) -> list[str]:
    crd = yaml.safe_load(render_all()["ascendtrainjobs.ascendtrain.dev.yaml"])
    rules = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-validations"]
    # Transition rules (oldSelf) run on updates only, as kube-apiserver runs them; this is a create.
    return [r["message"] for r in rules if "oldSelf" not in r["rule"]
            and CustomResourceSchema._program(r["rule"]).eval(data={"self": spec}).value() is not True]


def test_the_pods_only_evaluate_the_given_checkpoint():
    spec = AscendTrainJobSpec.model_validate(_spec())
    config = render.engine_config_map("ev", spec)
    assert list(config["data"]) == ["evaluation.yaml"]  # no training config to run
    evaluation = yaml.safe_load(config["data"]["evaluation.yaml"])
    assert evaluation["load"] == "/models/qwen3" and evaluation["tensorModelParallelSize"] == 2
    master, worker = (render.pod("ev", "default", spec, i)["spec"]["containers"][0]["command"] for i in (0, 1))
    assert master[:3] == ["python3", "-m", "ascend_engine.launcher"] and "--master-port=$(MASTER_PORT)" in master
    assert master[master.index("-m", 3):] == ["-m", "ascend_engine", "evaluate", "--config",
                                           "/etc/ascendtrain/evaluation.yaml"]
    assert "train" not in master
    assert worker[:2] == ["ascend-engine", "wait-for-master"] and worker[worker.index("--") + 1:] == master
    assert render.torchrun_env("ev", "default", spec, 1)["WORLD_SIZE"] == "4"


@pytest.mark.parametrize("change,message", [
    ({"evaluation": None}, "set train, evaluation or both"),
    ({"evaluation": {k: v for k, v in EVALUATION.items() if k != "load"}}, "evaluation.load is required"),
    ({"evaluation": {k: v for k, v in EVALUATION.items() if k != "tokenizerNameOrPath"}},
     "required to generate answers"),
    ({"datasetPrepRef": "prep"}, "datasetPrepRef and checkpointConvertRef feed training"),
    ({"checkpointConvertRef": "conv"}, "datasetPrepRef and checkpointConvertRef feed training"),
])
def test_cel_and_the_model_refuse_the_same_evaluation_only_jobs(change, message):
    spec = {k: v for k, v in {**_spec(), **change}.items() if v is not None}
    with pytest.raises(ValidationError, match=message):
        AscendTrainJobSpec.model_validate(spec)
    assert [m for m in _cel_refusals(spec) if message in m], _cel_refusals(spec)


def test_a_valid_evaluation_only_job_passes_every_cel_rule():
    spec = AscendTrainJobSpec.model_validate(_spec()).model_dump(by_alias=True, mode="json", exclude_none=True)
    assert "train" not in spec
    assert _cel_refusals(spec) == []
