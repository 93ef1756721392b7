"""An AscendTrainJob without `train` only evaluates an existing checkpoint: its pods run `torchrun ... evaluate`
alone, its ConfigMap holds the EvaluateConfig alone, and the model refuses what the CRD's CEL rules refuse
(kube-apiserver's refusals of the same jobs: tests/operator/test_manifests_on_the_server.py)."""
import pytest
import yaml
from pydantic import ValidationError

from ascend_operator.api.train_job import AscendTrainJobSpec
from ascend_operator.render import train_job as render

EVALUATION = {"task": ["mmlu"], "taskDataPath": ["/data/mmlu/test"], "tokenizerNameOrPath": "/models/qwen3",
              "load": "/models/qwen3", "tensorModelParallelSize": 2}


def _spec(**overrides):
    return {"image": "engine:1", "nnodes": 2, "nprocPerNode": 2, "evaluation": dict(EVALUATION), **overrides}


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
def test_the_model_refuses_the_evaluation_only_jobs_the_api_server_refuses(change, message):
    spec = {k: v for k, v in {**_spec(), **change}.items() if v is not None}
    with pytest.raises(ValidationError, match=message):
        AscendTrainJobSpec.model_validate(spec)


def test_a_valid_evaluation_only_job_has_no_train_block():
    spec = AscendTrainJobSpec.model_validate(_spec()).model_dump(by_alias=True, mode="json", exclude_none=True)
    assert "train" not in spec and spec["evaluation"]["load"] == "/models/qwen3"
