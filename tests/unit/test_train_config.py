"""`ascend-engine train` rejects a config that does not fit the launched world before building anything."""
from __future__ import annotations

import argparse

import pytest

from ascend_engine.config.loader import ConfigError
from ascend_engine.train import command


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_world_size_not_divisible_by_tp_pp_names_fields(tmp_path, monkeypatch):
    job = tmp_path / "job.yaml"
    job.write_text("parallel:\n  tensorModelParallelSize: 2\n  pipelineModelParallelSize: 2\n")
    monkeypatch.setenv("WORLD_SIZE", "6")
    with pytest.raises(ConfigError) as err:
        command.load_config(parse("--config", str(job)))
    message = str(err.value)
    assert str(job) in message
    assert "world size 6" in message
    assert "tensorModelParallelSize" in message and "pipelineModelParallelSize" in message


def test_global_batch_not_divisible_by_data_parallel(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ConfigError, match=r"globalBatchSize \(6\).*microBatchSize x data-parallel size = 1 x 4"):
        command.load_config(parse("--global-batch-size", "6", "--micro-batch-size", "1"))


def test_flags_override_yaml_and_precision_aliases(tmp_path, monkeypatch):
    job = tmp_path / "job.yaml"
    job.write_text("training:\n  trainIters: 7\n  precision: fp32\nmodel:\n  hiddenSize: 32\n")
    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = command.load_config(parse("--config", str(job), "--bf16", "--tensor-model-parallel-size", "2"))
    assert cfg.training.trainIters == 7 and cfg.training.precision == "bf16"
    assert cfg.parallel.tensorModelParallelSize == 2 and cfg.model.hiddenSize == 32
    assert command.load_config(parse("--fp16")).training.precision == "fp16"


def test_whole_manifest_is_read_from_spec_train(tmp_path, monkeypatch):
    job = tmp_path / "atj.yaml"
    job.write_text("apiVersion: ascendtrain.dev/v1alpha1\nkind: AscendTrainJob\nmetadata: {name: x}\n"
                   "spec:\n  train:\n    training:\n      seqLength: 48\n      microBatchSize: 0\n")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ConfigError, match=r"atj.yaml:8: spec.train.training.microBatchSize"):
        command.load_config(parse("--config", str(job)))


def test_a_null_in_a_plain_engine_file_is_refused_without_talk_of_kubernetes(tmp_path, monkeypatch):
    """``metricsPort: null`` in the engine's own YAML names the field, the line and what to write; the Kubernetes
    API server (why null is refused at all) is only mentioned for a custom resource, where it applies."""
    monkeypatch.setenv("WORLD_SIZE", "1")
    plain = tmp_path / "engine.yaml"
    plain.write_text("training:\n  trainIters: 2\nobservability:\n  metricsPort: null\n")
    with pytest.raises(ConfigError) as err:
        command.load_config(parse("--config", str(plain)))
    message = str(err.value)
    assert f"{plain}:4: observability.metricsPort" in message and "write 0 to disable" in message
    assert "Kubernetes" not in message
    manifest = tmp_path / "atj.yaml"
    manifest.write_text("apiVersion: ascendtrain.dev/v1alpha1\nkind: AscendTrainJob\nmetadata: {name: x}\n"
                        "spec:\n  train:\n    observability:\n      metricsPort: null\n")
    with pytest.raises(ConfigError, match=r"atj.yaml:7: spec.train.observability.metricsPort: null is not kept by "
                                          r"the Kubernetes API server"):
        command.load_config(parse("--config", str(manifest)))
