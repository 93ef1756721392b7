"""The layout's shape rules are one table (ascend_engine.config.shape_rules): the engine's model and the CRD's CEL
rules give the same verdict and the same message on a grid of layouts (kube-apiserver's own verdict on two of them:
tests/operator/test_manifests_on_the_server.py)."""
import functools
import itertools

import pytest
from pydantic import ValidationError

from ascend_engine.config.shape_rules import SHAPE_RULES, SPEC_RULES
from ascend_engine.config.train import TrainConfig
from ascend_operator.api.train_job import AscendTrainJobSpec
from test_spec_validation import _cel_ok, _cel_rules


@functools.cache
def _env():
    from cel_expr_python import cel
    from cel_expr_python.ext import ext_strings

    return cel.NewEnv(variables={"self": cel.Type.DYN}, extensions=[ext_strings.ExtStrings()])


def _cel(expression: str, spec: dict):
    return _env().compile(expression).eval(data={"self": spec}).value()


def _served(rule) -> dict:
    """The rule as the CRD holds it (on ``spec.train`` once ``crdgen.sink_rules`` moved it there)."""
    [served] = [r for r in _cel_rules() if r["message"] == rule.crd_rule()["message"]]
    return served


def _stored(spec: dict) -> dict:
    """The spec as the API server stores it: every field with a default present (the CRD schema defaults them),
    None-default fields absent."""
    out = {"image": "x", "nnodes": spec.get("nnodes", 1), "nprocPerNode": spec.get("nprocPerNode", 1)}
    defaults = TrainConfig().model_dump(exclude_none=True)
    train = spec["train"]
    merged = {k: ({**v, **train.get(k, {})} if isinstance(v, dict) else train.get(k, v)) for k, v in defaults.items()}
    return {**out, "train": {**train, **merged}}


LAYOUTS = [
    # (model, parallel, training, nnodes x nproc)
    *({"model": {"numLayers": layers, "numAttentionHeads": heads, "hiddenSize": 8 * heads * 2,
                 "groupQueryAttention": True, "numQueryGroups": groups},
       "parallel": {"tensorModelParallelSize": tp, "pipelineModelParallelSize": pp},
       "training": {"globalBatchSize": 8, "microBatchSize": 1}, "world": tp * pp}
      for layers, heads, groups, tp, pp in itertools.product((4, 6), (4, 6), (1, 2), (1, 2, 3), (1, 2, 4))
      if heads % groups == 0),
    {"model": {"numLayers": 8, "ffnHiddenSize": 90}, "parallel": {"tensorModelParallelSize": 4},
     "training": {"globalBatchSize": 4}, "world": 4},
    {"model": {"numLayers": 8, "numExperts": 4, "moeFfnHiddenSize": 6},
     "parallel": {"tensorModelParallelSize": 4, "sequenceParallel": True}, "training": {"globalBatchSize": 4},
     "world": 4},
    {"model": {"numLayers": 8, "paddedVocabSize": 258}, "parallel": {"tensorModelParallelSize": 4},
     "training": {"globalBatchSize": 4}, "world": 4},
    {"model": {"numLayers": 8, "paddedVocabSize": 256}, "parallel": {"tensorModelParallelSize": 4},
     "training": {"globalBatchSize": 4}, "world": 4},
    {"model": {"numLayers": 8}, "training": {"globalBatchSize": 6, "microBatchSize": 4}, "world": 1},
    *({"model": {"numLayers": layers},
       "parallel": {"pipelineModelParallelSize": pp, "numLayersPerVirtualPipelineStage": vpp},
       "training": {"globalBatchSize": gbs}, "world": pp}
      for layers, pp, vpp, gbs in itertools.product((8, 12), (1, 2), (1, 2, 3), (2, 3, 4))),
    # megatron-core's own refusals (each broken once, kept by a neighbour)
    *({"parallel": {"tensorModelParallelSize": tp, "sequenceParallel": True}, "training": {"seqLength": seq},
       "world": tp} for tp, seq in itertools.product((1, 2, 4), (62, 63, 64))),
    *({"parallel": {"tensorModelParallelSize": 2, "sequenceParallel": sp}, "world": 2,
       "data": {"isInstructionDataset": True, "variableSeqLengths": True, "padToMultipleOf": multiple}}
      for sp, multiple in itertools.product((False, True), (3, 8))),
    *({"stage": "grpo", "parallel": {"tensorModelParallelSize": 2, "sequenceParallel": sp}, "world": 2}
      for sp in (False, True)),
    *({"model": {"positionEmbeddingType": kind, "maxPositionEmbeddings": positions}, "world": 1}
      for kind, positions in itertools.product(("rope", "learned_absolute"), (16, 64, 128))),
    *({"model": {"positionEmbeddingType": kind, **shape}, "world": 1}
      for kind, shape in itertools.product(("rope", "learned_absolute", "none"), (
          {"kvChannels": 15}, {"kvChannels": 16}, {"hiddenSize": 60, "numAttentionHeads": 4},
          {"hiddenSize": 60, "numAttentionHeads": 4, "kvChannels": 16}, {"hiddenSize": 62, "numAttentionHeads": 4}))),
    *({"model": {"numExperts": 4, "addBiasLinear": bias, "moeSharedExpertIntermediateSize": shared},
       "parallel": {"tensorModelParallelSize": tp, "sequenceParallel": tp > 1}, "world": tp}
      for bias, shared, tp in itertools.product((False, True), (32, 33), (1, 2))),
    {"model": {"addBiasLinear": True}, "world": 1},
    *({"model": {"numExperts": 4, "moeRouterTopk": topk, "moeRouterPreSoftmax": pre,
                 "moeRouterLoadBalancingType": balancing, "moeAuxLossCoeff": coeff}, "world": 1}
      for topk, pre, balancing, coeff in itertools.product((1, 2), (False, True), ("aux_loss", "sinkhorn"),
                                                           (0, 0.0, 0.01))),
    {"model": {"moeRouterTopk": 1, "moeRouterLoadBalancingType": "sinkhorn", "moeAuxLossCoeff": 0.01}, "world": 1},
    *({"model": {"numExperts": 4, "moeTokenDispatcherType": dispatcher}, "world": 1,
       "data": {"isInstructionDataset": True, "variableSeqLengths": variable}}
      for dispatcher, variable in itertools.product(("alltoall", "allgather"), (False, True))),
    *({"device": device, "model": {"numExperts": 4, "moeGroupedGemm": grouped}, "training": {"precision": precision},
       "world": 1}
      for device, grouped, precision in itertools.product(("cpu", "npu", "auto"), (False, True), ("fp32", "bf16"))),
]


def _spec(layout: dict) -> dict:
    train = {k: v for k, v in layout.items() if k != "world"}
    return {"image": "x", "nnodes": 1, "nprocPerNode": layout["world"], "train": train}


@pytest.mark.parametrize("rule", SHAPE_RULES + SPEC_RULES, ids=lambda r: r.message[:60])
def test_python_and_cel_agree_on_every_layout(rule):
    crd, served = rule.crd_rule(), _served(rule)
    broken_somewhere = kept_somewhere = False
    for layout in LAYOUTS:
        spec = _spec(layout)
        stored = _stored(spec)
        cel_ok = _cel(crd["rule"], stored) is True
        assert _cel_ok(served, stored) == cel_ok, (served["rule"], layout)
        if rule.spec_level:
            cfg = AscendTrainJobSpec.model_construct(
                nnodes=1, nprocPerNode=layout["world"], train=TrainConfig.model_validate(spec["train"])) \
                if _model_ok(spec["train"]) else None
        else:
            cfg = _construct(spec["train"])
        if cfg is None:
            continue  # another rule of the model refuses it first; this rule's CEL is judged on other layouts
        py_ok = rule.ok(cfg)
        assert cel_ok == py_ok, (rule.message, layout)
        if not py_ok:
            broken_somewhere = True
            message = _cel(crd["messageExpression"], stored) if "messageExpression" in crd else crd["message"]
            assert message == rule.text(cfg), (message, layout)
            if "messageExpression" in served:
                node = stored if not served["_at"] else stored["train"]
                assert _cel(served["messageExpression"], node) == message
        else:
            kept_somewhere = True
    assert broken_somewhere and kept_somewhere, "the grid must exercise both verdicts"


def _model_ok(train: dict) -> bool:
    try:
        TrainConfig.model_validate(train)
        return True
    except ValidationError:
        return False


def _construct(train: dict):
    """A TrainConfig with the layout's sub-models validated one by one (the whole model would refuse the broken
    layouts this test is about)."""
    from ascend_engine.config.model import ModelConfig
    from ascend_engine.config.train import ParallelConfig, TrainingConfig

    from ascend_engine.config.train import DataConfig

    try:
        return TrainConfig.model_construct(model=ModelConfig.model_validate(train.get("model", {})),
                                           parallel=ParallelConfig.model_validate(train.get("parallel", {})),
                                           training=TrainingConfig.model_validate(train.get("training", {})),
                                           data=DataConfig.model_validate(train.get("data", {})),
                                           device=train.get("device", "auto"), stage=train.get("stage"))
    except ValidationError:
        return None


def test_the_model_refuses_with_the_tables_message():
    with pytest.raises(ValidationError, match=r"parallel.pipelineModelParallelSize \(4\) must divide "
                                              r"model.numLayers \(6\)"):
        TrainConfig.model_validate({"model": {"numLayers": 6}, "parallel": {"pipelineModelParallelSize": 4}})
    with pytest.raises(ValidationError, match=r"tensorModelParallelSize \(4\) must divide model.paddedVocabSize "
                                              r"\(258\)"):
        TrainConfig.model_validate({"model": {"paddedVocabSize": 258}, "parallel": {"tensorModelParallelSize": 4}})
