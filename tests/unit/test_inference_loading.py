"""Inference (generate, evaluate) loads a checkpoint's rank files as they are only when they hold whole layers:
an expert-parallel or virtual-pipeline checkpoint is refused by generate with the reshard to run, and evaluate
converts it on the fly like another TP/PP layout."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from ascend_engine.checkpoint.training import CheckpointMismatch
from ascend_engine.generate.loading import layout


def args(**extra):
    return SimpleNamespace(tensor_model_parallel_size=2, pipeline_model_parallel_size=1, **extra)


def test_dense_checkpoints_load_at_their_own_layout():
    assert layout(args()) == (2, 1)
    assert layout(args(expert_model_parallel_size=1, num_layers_per_virtual_pipeline_stage=None)) == (2, 1)


@pytest.mark.parametrize("extra, named", [({"expert_model_parallel_size": 2}, "expert parallel size 2"),
                                          ({"num_layers_per_virtual_pipeline_stage": 1}, "virtual pipeline stages")])
def test_expert_parallel_and_virtual_pipeline_checkpoints_name_the_reshard(extra, named):
    with pytest.raises(CheckpointMismatch) as failure:
        layout(args(**extra))
    assert named in str(failure.value) and "--target-expert-parallel-size 1" in str(failure.value)


def test_evaluate_converts_such_checkpoints_on_the_fly(tmp_path, monkeypatch):
    from ascend_engine.config.evaluate import EvaluateConfig
    from ascend_engine.evaluate import runner

    (tmp_path / "latest_checkpointed_iteration.txt").write_text("1")
    monkeypatch.setattr("ascend_engine.generate.loading.read_args",
                        lambda root: (1, args(expert_model_parallel_size=2)))
    cfg = EvaluateConfig.model_validate({"load": str(tmp_path), "task": ["mmlu"], "taskDataPath": ["x"],
                                         "tokenizerNameOrPath": "t"})
    assert runner._layout(cfg) == (True, 2, 1, (2, 1))
