"""The elastic range of an AscendTrainJob: bad ranges are refused with the field named, by the model and by the
CRD's CEL rules alike, and the sizes the operator may resize to are those TP x PP and the global batch allow."""
import pytest
from pydantic import ValidationError

from ascend_engine.config.loader import format_validation_error
from ascend_operator.api.train_job import AscendTrainJobSpec
from test_spec_validation import _cel_ok, _cel_rules


def _spec(nnodes=4, min_nodes=1, nproc=2, tp=1, gbs=16, mbs=1, save="/ckpt", **extra):
    checkpoint = {"save": save} if save else {}
    return {"image": "x", "nnodes": nnodes, "nprocPerNode": nproc, "elastic": {"minNodes": min_nodes},
            "train": {"model": {"numLayers": 2}, "parallel": {"tensorModelParallelSize": tp},
                      "training": {"globalBatchSize": gbs, "microBatchSize": mbs}, "checkpoint": checkpoint},
            **extra}


def _cel_failures(spec):
    return [r for r in _cel_rules() if "elastic" in r["rule"] and "oldSelf" not in r["rule"] and not _cel_ok(r, spec)]


def _defaulted(spec):
    """What the API server's CEL sees: schema defaults applied (the model's defaults are the same values)."""
    train = AscendTrainJobSpec.model_fields["train"].annotation.__args__[0].model_validate(spec["train"])
    return {**spec, "train": train.model_dump(mode="json", exclude_none=True)}


@pytest.mark.parametrize("kwargs,field,words", [
    ({"min_nodes": 5}, "elastic.minNodes", "must be at most nnodes"),
    ({"min_nodes": 1, "nproc": 1, "tp": 2, "nnodes": 4}, "elastic.minNodes", "tensorModelParallelSize"),
    ({"min_nodes": 3, "gbs": 8}, "elastic.minNodes", "globalBatchSize"),
    ({"save": None}, "train.checkpoint.save", "elastic needs train.checkpoint.save"),
])
def test_bad_range_is_refused_by_the_model_and_the_api_server(kwargs, field, words):
    spec = _spec(**kwargs)
    with pytest.raises(ValidationError) as err:
        AscendTrainJobSpec.model_validate(spec)
    text = format_validation_error(err.value, "AscendTrainJob ns/j", prefix=("spec",))
    assert words in text and field.split(".")[0] in text, text
    failed = _cel_failures(_defaulted(spec))
    assert failed and failed[0]["fieldPath"] == "." + field and words.split()[-1] in failed[0]["message"], failed


def test_elastic_with_a_trainer_command_is_refused():
    spec = {"image": "x", "nnodes": 2, "elastic": {"minNodes": 1}, "trainer": {"command": ["python", "t.py"]}}
    with pytest.raises(ValidationError, match="elastic needs train"):
        AscendTrainJobSpec.model_validate(spec)
    assert [r["fieldPath"] for r in _cel_failures(spec)] == [".elastic"]


def test_sizes_skip_world_sizes_that_tp_or_the_global_batch_forbid():
    ok = _spec(nnodes=6, min_nodes=2, nproc=1, tp=2, gbs=12)
    assert _cel_failures(_defaulted(ok)) == []
    # world 6, 4, 2 divide TP 2 (dp 3, 2, 1); 5 and 3 do not.
    assert AscendTrainJobSpec.model_validate(ok).elastic_sizes() == [6, 4, 2]
    batch = AscendTrainJobSpec.model_validate(_spec(nnodes=4, min_nodes=1, nproc=1, gbs=8))
    assert batch.elastic_sizes() == [4, 2, 1]  # dp 3 does not divide a global batch of 8
    assert AscendTrainJobSpec.model_validate({**_spec(), "elastic": None}).elastic_sizes() == [4]
