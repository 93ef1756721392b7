"""`ascend-train validate` / `apply --dry-run` check a manifest offline with the generated CRD's fields and the
spec models: every problem at once, as file:line: field, typos with the nearest field; a bad value given by an
engine flag is blamed on the flag, not on the config file's line."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import yaml

from ascend_engine.config.loader import ConfigError, add_flags, build_config
from ascend_engine.config.train import TrainConfig
from ascend_train.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def lines_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_every_problem_is_reported_with_file_line_field_and_a_suggestion(tmp_path, capsys):
    text = (EXAMPLES / "quickstart.yaml").read_text()
    text = text.replace("tensorModelParallelSize: 2", "tensorModelParalelSize: 2")
    text = text.replace("numLayers: 2", "numLayers: two").replace("microBatchSize: 2", "microBatchSize: 0")
    text = text.replace("tensorModelParalelSize: 2", "tensorModelParalelSize: 2\n      pipelineModelParallelSize: 4")
    path = tmp_path / "job.yaml"
    path.write_text(text)
    assert main(["validate", "-f", str(path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert f'{path}:{lines_of(text, "tensorModelParalelSize")}: spec.train.parallel.tensorModelParalelSize: ' \
           'unknown field "tensorModelParalelSize" (did you mean "tensorModelParallelSize"?)' in err
    assert any(e.startswith(f'{path}:{lines_of(text, "numLayers")}: spec.train.model.numLayers: ') and "integer" in e
               for e in err)
    assert any(e.startswith(f'{path}:{lines_of(text, "microBatchSize")}: spec.train.training.microBatchSize: ')
               for e in err)
    assert err[-1] == f"{path}: 3 problem(s)" and len(err) == 4, err
    # A rule across fields (the model's, also the CRD's CEL rule) once the fields themselves are right
    layout = (EXAMPLES / "quickstart.yaml").read_text().replace("nnodes: 2", "nnodes: 2\n  nprocPerNode: 3")
    path.write_text(layout.replace("  nprocPerNode: 1\n", ""))
    assert main(["validate", "-f", str(path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert "must be a multiple of microBatchSize x data-parallel size = 2 x 3" in err[0] and len(err) == 2, err


def test_a_layout_megatron_core_refuses_is_reported_with_the_field_and_its_figures(tmp_path, capsys):
    """Issue 49's example (sequence parallelism over 63 tokens at TP 2, which megatron-core's first step refuses):
    one problem, at the line of ``train:`` (the model's cross-field rule is the train section's), whose message
    names the field and its figures as kube-apiserver's 422 does (tests/operator/test_manifests_on_the_server.py)."""
    text = (EXAMPLES / "quickstart.yaml").read_text()
    assert "tensorModelParallelSize: 2\n" in text and "seqLength: " in text
    text = text.replace("tensorModelParallelSize: 2\n", "tensorModelParallelSize: 2\n      sequenceParallel: true\n")
    text = re.sub(r"seqLength: \d+", "seqLength: 63", text)
    path = tmp_path / "job.yaml"
    path.write_text(text)
    assert main(["validate", "-f", str(path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [f"{path}:{lines_of(text, '  train:')}: spec.train: training.seqLength (63) must be a multiple of "
                   "parallel.tensorModelParallelSize (2) with sequenceParallel: megatron-core splits every sequence "
                   "evenly over the tensor-parallel ranks", f"{path}: 1 problem(s)"], err


def test_apply_dry_run_needs_no_cluster_and_accepts_the_examples(tmp_path, capsys):
    assert main(["--root", str(tmp_path / "none"), "apply", "--dry-run", "-f", str(EXAMPLES / "pipeline.yaml")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "ascendtrainjob/sft valid (dry run)" in out and len(out) == 5  # the workspace claim and 4 of ours
    assert not (tmp_path / "none").exists()


def test_a_bad_flag_value_is_blamed_on_the_flag_not_the_file(tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({"parallel": {"tensorModelParallelSize": 2}, "training": {"microBatchSize": 2}}))
    parser = argparse.ArgumentParser()
    dests = add_flags(parser, TrainConfig)
    args = parser.parse_args(["--tensor-model-parallel-size", "0"])
    with pytest.raises(ConfigError) as failure:
        build_config(TrainConfig, args, dests, str(config))
    message = str(failure.value)
    assert "command line --tensor-model-parallel-size: parallel.tensorModelParallelSize:" in message
    assert f"{config}:" not in message
    args = parser.parse_args(["--micro-batch-size", "4"])
    config.write_text("training:\n  microBatchSize: 2\nparallel:\n  tensorModelParallelSize: 0\n")
    with pytest.raises(ConfigError) as failure:
        build_config(TrainConfig, args, dests, str(config))
    assert str(failure.value).startswith(f"{config}:4: parallel.tensorModelParallelSize:")


def test_help_shows_the_models_defaults(capsys):
    from ascend_engine.cli import main as engine_main

    with pytest.raises(SystemExit):
        engine_main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "[parallel.tensorModelParallelSize] (default: 1)" in text and "[optimizer.lr] (default: 0.001)" in text
    with pytest.raises(SystemExit):
        main(["local", "up", "--help"])
    assert "(default: False)" in capsys.readouterr().out  # --fresh


def test_a_null_device_resource_is_refused_with_what_to_write(tmp_path, capsys):
    """``devices.resource: null`` would be dropped by kube-apiserver and defaulted to an Ascend device: a CPU user
    who meant "no device" would find the pods Pending on Insufficient huawei.com/Ascend910. Said at validate."""
    text = (EXAMPLES / "quickstart.yaml").read_text()
    path = tmp_path / "job.yaml"
    path.write_text(text.replace("resource: none ", "resource: null "))
    assert main(["validate", "-f", str(path)]) == 1
    line = lines_of(path.read_text(), "resource: null")
    assert f"{path}:{line}: spec.devices.resource: null is not kept by the Kubernetes API server" in \
        capsys.readouterr().err


def test_an_unknown_field_hides_no_other_problem(tmp_path, capsys):
    """Issue 52: a typo'd lrWarmupIter beside a globalBatchSize of 5 (no multiple of the micro batch) is two
    problems, both named at once: the typo no longer stops the model's own checks of the same object."""
    text = (EXAMPLES / "quickstart.yaml").read_text()
    text = text.replace("lrWarmupIters: 3", "lrWarmupIter: 3").replace("globalBatchSize: 4", "globalBatchSize: 5")
    path = tmp_path / "job.yaml"
    path.write_text(text)
    assert main(["validate", "-f", str(path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert f'{path}:{lines_of(text, "lrWarmupIter")}: spec.train.optimizer.lrWarmupIter: unknown field ' \
           '"lrWarmupIter" (did you mean "lrWarmupIters"?)' in err, err
    assert any("globalBatchSize (5) must be a multiple of" in e for e in err), err
    assert err[-1] == f"{path}: 2 problem(s)", err
    from ascend_operator.sdk import InvalidSpec, TrainClient

    manifest = [d for d in yaml.safe_load_all(text) if d and d["kind"] == "AscendTrainJob"][0]
    with pytest.raises(InvalidSpec) as refused:
        TrainClient.__new__(TrainClient).validate(manifest)
    said = str(refused.value)
    assert "lrWarmupIter" in said and "globalBatchSize (5)" in said, said
