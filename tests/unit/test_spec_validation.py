"""A bad job is rejected with the field named, and the engine's own check agrees with the CRD's CEL rule
(kube-apiserver's verdict on the same jobs: tests/operator/test_manifests_on_the_server.py)."""
import functools

import pytest
import yaml
from pydantic import ValidationError

from ascend_engine.config.loader import ConfigError, build_config, format_validation_error
from ascend_engine.config.train import TrainConfig
from ascend_operator.api.crdgen import render_all
from ascend_operator.api.train_job import AscendTrainJobSpec


CREATE_GUARD = "oldSelf.hasValue() || ("


def _cel_rules():
    """The spec's rules and those on ``spec.train`` (``crdgen.sink_rules`` moves a rule that reads only ``train``
    there), as kube-apiserver evaluates them on a create: a rule guarded to run on creation only
    (``api/immutability.py``: ``oldSelf`` has no value then, so the guard leaves the rule itself) is its body.
    ``_at`` says which node's ``self`` the rule reads."""
    crd = yaml.safe_load(render_all()["ascendtrainjobs.ascendtrain.dev.yaml"])
    spec_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    placed = [(r, ()) for r in spec_schema["x-kubernetes-validations"]]
    placed += [(r, ("train",)) for r in spec_schema["properties"]["train"].get("x-kubernetes-validations", [])]
    return [{**r, "rule": r["rule"].removeprefix(CREATE_GUARD).removesuffix(")"), "_at": at}
            if r["rule"].startswith(CREATE_GUARD) else {**r, "_at": at} for r, at in placed]


@functools.cache
def _cel_program(expression: str):
    from cel_expr_python import cel
    from cel_expr_python.ext import ext_strings

    env = cel.NewEnv(variables={"self": cel.Type.DYN}, extensions=[ext_strings.ExtStrings()])
    return env.compile(expression)


def _cel_ok(rule, spec):
    """One rule of the CRD evaluated in-process by a CEL library (test_moe_config.py and test_elastic_spec.py
    compare single rules with the model so); kube-apiserver itself judges whole jobs in tests/operator. A rule
    whose node is absent does not run."""
    node = spec
    for key in rule["_at"]:
        if key not in node:
            return True
        node = node[key]
    return _cel_program(rule["rule"]).eval(data={"self": node}).value() is True


@pytest.mark.parametrize("nnodes,nproc,tp,pp,ok", [
    (2, 1, 2, 1, True), (2, 8, 2, 4, True), (1, 3, 2, 1, False), (3, 1, 2, 1, False), (2, 2, 1, 8, False),
])
def test_world_size_rule_of_the_model(nnodes, nproc, tp, pp, ok):
    """The same cases as the API server's test_the_world_size_rule_is_the_engines."""
    spec = {"image": "x", "nnodes": nnodes, "nprocPerNode": nproc,
            "train": {"model": {"numLayers": 8}, "parallel": {"tensorModelParallelSize": tp,
                                                               "pipelineModelParallelSize": pp},
                      "training": {"globalBatchSize": 64}}}
    if ok:
        AscendTrainJobSpec.model_validate(spec)
    else:
        with pytest.raises(ValidationError) as err:
            AscendTrainJobSpec.model_validate(spec)
        text = format_validation_error(err.value, "AscendTrainJob ns/j", prefix=("spec",))
        assert "nnodes x nprocPerNode" in text and "tensorModelParallelSize" in text


def test_missing_field_is_named():
    with pytest.raises(ValidationError) as err:
        AscendTrainJobSpec.model_validate({"image": "a:1", "nnodes": 1, "runtimeRef": {}, "train": {}})
    assert "AscendTrainJob ns/j: spec.runtimeRef.name: Field required" in format_validation_error(
        err.value, "AscendTrainJob ns/j", prefix=("spec",))
    # a job's image may come from its training runtime (spec.runtimeRef)
    with pytest.raises(ValidationError) as err:
        AscendTrainJobSpec.model_validate({"nnodes": 1, "train": {}})
    assert "image is required unless runtimeRef names a training runtime" in format_validation_error(
        err.value, "AscendTrainJob ns/j", prefix=("spec",))


def test_engine_config_file_errors_name_file_line_and_field(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("model:\n  numLayers: 2\nparallel:\n  tensorModelParallelSize: zero\n")
    with pytest.raises(ConfigError) as err:
        build_config(TrainConfig, _no_flags(), {}, str(path))
    assert f"{path}:4: parallel.tensorModelParallelSize: Input should be a valid integer" in str(err.value)


def test_engine_reads_a_whole_custom_resource(tmp_path):
    path = tmp_path / "atj.yaml"
    path.write_text("apiVersion: ascendtrain.dev/v1alpha1\nkind: AscendTrainJob\nmetadata: {name: x}\n"
                    "spec:\n  image: x\n  train:\n    training:\n      trainIters: -3\n")
    with pytest.raises(ConfigError) as err:
        build_config(TrainConfig, _no_flags(), {}, str(path), section="train")
    assert f"{path}:8: spec.train.training.trainIters: Input should be greater than or equal to 1" in str(err.value)


def _no_flags():
    import argparse
    return argparse.Namespace()
