"""MoE, expert-parallel and virtual-pipeline settings: the engine's checks, the CRD's CEL rules agreeing with them, the importer
mapping MindSpeed-LLM's MoE flags, and grouped GEMM refused on CPU with a clear message."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from ascend_engine.config.train import ModelConfig, ParallelConfig, TrainConfig
from ascend_operator.api.train_job import AscendTrainJobSpec
from test_spec_validation import _cel_ok, _cel_rules

MOE = {"numLayers": 4, "numExperts": 8, "moeRouterTopk": 2, "ffnHiddenSize": 256}


def _spec(nnodes, nproc, tp, pp, ep, experts=8):
    model = {**MOE, "numExperts": experts} if experts else {"numLayers": 4}
    return {"image": "x", "nnodes": nnodes, "nprocPerNode": nproc,
            "train": {"model": model, "parallel": {"tensorModelParallelSize": tp, "pipelineModelParallelSize": pp,
                                                   "expertModelParallelSize": ep, "sequenceParallel": tp > 1},
                      "training": {"globalBatchSize": 64}}}


@pytest.mark.parametrize("nnodes,nproc,tp,pp,ep,experts,ok", [
    (1, 8, 2, 1, 4, 8, True),     # TP2 x EP4 on 8 ranks
    (2, 8, 2, 2, 4, 8, True),
    (1, 4, 2, 1, 4, 8, False),    # 4 ranks cannot hold TP2 x EP4 expert layers
    (1, 6, 1, 1, 3, 8, False),    # 8 experts do not split over EP3
    (1, 4, 1, 1, 2, None, False),  # EP without experts
])
def test_expert_rules_agree_between_cel_and_pydantic(nnodes, nproc, tp, pp, ep, experts, ok):
    spec = _spec(nnodes, nproc, tp, pp, ep, experts)
    rules = [r for r in _cel_rules() if "expertModelParallelSize" in r["rule"] and "elastic" not in r["rule"]]
    assert len(rules) == 2
    if ok:
        defaulted = AscendTrainJobSpec.model_validate(spec).model_dump(by_alias=True, mode="json", exclude_none=True)
        assert all(_cel_ok(r, defaulted) for r in rules)
        return
    with pytest.raises(ValidationError) as err:
        AscendTrainJobSpec.model_validate(spec)
    assert "expertModelParallelSize" in str(err.value)
    train = spec["train"]
    cel_input = {**spec, "train": {
        "model": ModelConfig.model_validate(train["model"]).model_dump(mode="json", exclude_none=True),
        "parallel": ParallelConfig.model_validate(train["parallel"]).model_dump(mode="json")}}
    assert not all(_cel_ok(r, cel_input) for r in rules)


@pytest.mark.parametrize("tp,sequence_parallel,experts,ok", [
    (2, False, 8, False),  # megatron-core's MoE layer raises at the first training step
    (2, True, 8, True), (1, False, 8, True), (2, False, None, True),
])
def test_moe_with_tensor_parallelism_needs_sequence_parallelism_in_cel_and_pydantic(tp, sequence_parallel, experts,
                                                                                   ok):
    spec = _spec(1, 8, tp, 1, 1, experts)
    spec["train"]["parallel"]["sequenceParallel"] = sequence_parallel
    [rule] = [r for r in _cel_rules() if "sequenceParallel" in r["rule"] and "numExperts" in r["rule"]]
    cel_input = {**spec, "train": {
        "model": ModelConfig.model_validate(spec["train"]["model"]).model_dump(mode="json", exclude_none=True),
        "parallel": ParallelConfig.model_validate(spec["train"]["parallel"]).model_dump(mode="json")}}
    assert _cel_ok(rule, cel_input) == ok
    if ok:
        AscendTrainJobSpec.model_validate(spec)
        return
    with pytest.raises(ValidationError) as err:
        AscendTrainJobSpec.model_validate(spec)
    assert rule["message"] in str(err.value)  # the API server and the engine say the same
    assert "needs parallel.sequenceParallel" in rule["message"]


def test_moe_model_checks_name_the_fields():
    with pytest.raises(ValidationError, match="moeRouterTopk"):
        ModelConfig(numExperts=2, moeRouterTopk=4)
    with pytest.raises(ValidationError, match="moeSharedExpertGate needs moeSharedExpertIntermediateSize"):
        ModelConfig(numExperts=4, moeSharedExpertGate=True)
    with pytest.raises(ValidationError, match=r"tensorModelParallelSize \(4\) must divide model.moeFfnHiddenSize"):
        TrainConfig.model_validate({"model": {**MOE, "moeFfnHiddenSize": 6, "numAttentionHeads": 4},
                                    "parallel": {"tensorModelParallelSize": 4}})


def test_importer_maps_moe_flags():
    from ascend_engine.importer.train_flags import map_flags

    flags = [("--num-experts", ["128"]), ("--moe-router-topk", ["8"]), ("--moe-ffn-hidden-size", ["768"]),
             ("--expert-model-parallel-size", ["8"]), ("--moe-aux-loss-coeff", ["0.001"]),
             ("--moe-router-load-balancing-type", ["aux_loss"]), ("--moe-token-dispatcher-type", ["alltoall"]),
             ("--moe-grouped-gemm", []), ("--moe-z-loss-coeff", ["0.001"]), ("--shared-expert-gate", []),
             ("--moe-shared-expert-intermediate-size", ["512"]), ("--num-layers", ["8"]),
             ("--pipeline-model-parallel-size", ["2"]), ("--num-layers-per-virtual-pipeline-stage", ["2"]),
             ("--bf16", [])]  # grouped GEMM computes in bf16 only (megatron-core's GroupedMLP; shape_rules.py)
    out = map_flags(flags)
    assert not out.skipped, out.skipped
    cfg = TrainConfig.model_validate({**out.data, "model": {**out.data["model"], "ffnHiddenSize": 256}})
    model = cfg.model
    assert (model.numExperts, model.moeRouterTopk, model.moeFfnHiddenSize) == (128, 8, 768)
    assert model.moeGroupedGemm is True and model.moeSharedExpertGate is True
    assert model.moeTokenDispatcherType == "alltoall" and model.moeZLossCoeff == 0.001
    assert cfg.parallel.expertModelParallelSize == 8
    assert cfg.parallel.numLayersPerVirtualPipelineStage == 2 and cfg.virtual_pipeline_size == 2


def test_grouped_gemm_refused_on_cpu(monkeypatch):
    from ascend_engine.models import gpt

    monkeypatch.setattr(gpt, "applied_backend", lambda: "cpu")
    with pytest.raises(ValueError, match=r"moeGroupedGemm \(--moe-grouped-gemm\) needs a GPU or NPU"):
        gpt.moe_settings(ModelConfig(**MOE, moeGroupedGemm=True), variable_seq_lengths=False)
    assert gpt.moe_settings(ModelConfig(**MOE), False)["num_moe_experts"] == 8
