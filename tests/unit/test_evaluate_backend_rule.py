"""Which tasks run where: our own task names go to our implementation, lm-eval's to lm-evaluation-harness, and
one run uses one backend (docs/evaluation.md, "lm-evaluation-harness tasks")."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from ascend_engine.config.evaluate import EvaluateConfig

BASE = {"load": "/ckpt", "tokenizerNameOrPath": "/tok"}


def test_our_names_stay_ours_and_other_names_go_to_lm_eval():
    ours = EvaluateConfig(task=["mmlu", "gsm8k"], taskDataPath=["a", "b"], **BASE)
    assert not ours.uses_lm_eval
    theirs = EvaluateConfig(task=["arc_easy", "lm-eval:mmlu"], **BASE)
    assert theirs.uses_lm_eval and theirs.lm_eval_tasks == ["arc_easy", "mmlu"]
    # the example: lm-eval's mmlu, hellaswag and gsm8k, by the backend field
    named = EvaluateConfig(task=["mmlu", "hellaswag", "gsm8k"], backend="lm-eval", includePath=["/tasks"], **BASE)
    assert named.uses_lm_eval and named.lm_eval_tasks == ["mmlu", "hellaswag", "gsm8k"]


@pytest.mark.parametrize("spec, message", [
    ({"task": ["mmlu", "arc_easy"], "taskDataPath": ["a", "b"]}, "one run uses one backend"),
    ({"task": ["arc_easy"], "backend": "native", "taskDataPath": ["a"]}, "backend native runs only our tasks"),
    ({"task": ["lm-eval:mmlu"], "backend": "native", "taskDataPath": ["a"]}, "backend native runs only our tasks"),
    ({"task": ["arc_easy"], "taskDataPath": ["a"]}, "taskDataPath: for our own tasks only"),
    ({"task": ["arc_easy"], "promptType": "qwen3"}, "promptType: lm-eval tasks take no preprocess template"),
    ({"task": ["mmlu"]}, "taskDataPath: our tasks read local files"),
    ({"task": ["mmlu"], "taskDataPath": ["a"], "includePath": ["/t"]}, "includePath: lm-eval task folders"),
    ({"task": ["mmlu"], "taskDataPath": ["a"], "datasetsDir": "/d"}, "datasetsDir: hub datasets for lm-eval tasks"),
])
def test_mixed_or_misplaced_settings_are_refused(spec, message):
    with pytest.raises(ValidationError, match=message):
        EvaluateConfig(**spec, **BASE)


def test_the_job_schema_takes_any_task_name():
    """The CRD's task list is free text now (lm-eval has thousands of names); the backend field is an enum."""
    from ascend_operator.api.crdgen import RESOURCES, crd

    jobs = [crd(r) for r in RESOURCES.values() if r.kind.crd_name.startswith("ascendtrainjobs.")]
    spec = jobs[0]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    evaluation = spec["properties"]["evaluation"]["properties"]
    assert "enum" not in evaluation["task"]["items"]
    assert evaluation["backend"]["enum"] == ["native", "lm-eval"]
    assert evaluation["includePath"]["type"] == "array"
