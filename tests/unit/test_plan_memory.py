"""The memory plan's arithmetic against hand-computed and published figures, the device table, and the refusal
where it is made offline (``ascend-train plan`` / ``validate`` / ``apply``). The estimate against measured peak memory
of real training on CPU: benchmarks/plan_memory.py (docs/plan.md has its figures)."""
from __future__ import annotations

import pytest
import yaml

from ascend_engine.config.train import TrainConfig
from ascend_engine.plan.memory import GIB, _layer_activation_bytes, estimate, in_flight, stage_layers
from ascend_operator.api.devices import TrainDeviceSettings, device_memory
from ascend_train.cli import main

# The model of benchmarks/plan_memory.py; megatron-core built it with 58,466,816 parameters (counted from the
# built model's parameters on CPU, 2026-11-26).
BENCH_MODEL = {"numLayers": 8, "hiddenSize": 512, "ffnHiddenSize": 1408, "numAttentionHeads": 8, "vocabSize": 32000}


def _cfg(**blocks) -> TrainConfig:
    return TrainConfig.model_validate({"device": "cpu", **blocks})


def test_parameters_are_megatrons_count():
    plan = estimate(_cfg(model=BENCH_MODEL), 1)
    assert plan.stages[0].parameters == 58_466_816
    pp2 = estimate(_cfg(model=BENCH_MODEL, parallel={"pipelineModelParallelSize": 2}), 2)
    embedding = 32000 * 512
    assert [s.parameters for s in pp2.stages] == [(58_466_816 - 2 * embedding - 512) // 2 + embedding,
                                                  (58_466_816 - 2 * embedding - 512) // 2 + embedding + 512]


def test_tiny_model_by_hand():
    # 2 layers, hidden 64, 4 heads, SwiGLU MLP 256 wide, vocabulary 256, RMSNorm, untied output:
    # attention 64 x (64 + 2 x 64) + 64 x 64 = 16384, its norm 64; MLP 3 x 64 x 256 = 49152, its norm 64
    layer = 16384 + 64 + 49152 + 64
    plan = estimate(_cfg(model={"ffnHiddenSize": 256}), 1)
    assert plan.stages[0].parameters == 2 * layer + 2 * 256 * 64 + 64
    tp2 = estimate(_cfg(model={"ffnHiddenSize": 256}, parallel={"tensorModelParallelSize": 2}), 2)
    # split by TP: the linear layers and the (padded to 256) vocabulary; the norms whole
    assert tp2.stages[0].parameters == 2 * ((16384 + 49152) // 2 + 128) + 2 * 256 * 64 // 2 + 64


@pytest.mark.parametrize("precision,dist,dp,per_param", [
    # Megatron-core's published bytes per parameter (docs: Distributed Optimizer): bf16 params with fp32 grads
    # 18 / 6 + 12/d, fp32 16 / 8 + 8/d
    ("bf16", False, 4, 18), ("bf16", True, 4, 6 + 12 / 4), ("fp32", False, 8, 16), ("fp32", True, 8, 8 + 8 / 8),
])
def test_model_states_are_megatrons_bytes_per_parameter(precision, dist, dp, per_param):
    cfg = _cfg(model=BENCH_MODEL, parallel={"useDistributedOptimizer": dist},
               training={"precision": precision, "globalBatchSize": dp})
    stage = estimate(cfg, dp).stages[0]
    states = stage.params_bytes + stage.grads_bytes + stage.optimizer_bytes
    assert states / stage.parameters == pytest.approx(per_param, rel=1e-6)


def _gpt3_like(tp: int, sp: bool, recompute: str | None) -> TrainConfig:
    """Korthikanti et al.'s transformer: GeLU MLP of 4h, multi-head attention, LayerNorm, dropout, 16-bit, fused
    norms (an accelerator: on CPU torch's norms keep one more tensor each)."""
    return _cfg(device="npu", model={"numLayers": 2, "hiddenSize": 256, "numAttentionHeads": 8, "swiglu": False,
                       "normalization": "LayerNorm", "attentionDropout": 0.1, "hiddenDropout": 0.1},
                parallel={"tensorModelParallelSize": tp, "sequenceParallel": sp},
                training={"precision": "bf16", "seqLength": 512, "microBatchSize": 2, "globalBatchSize": 2,
                          **({"recomputeGranularity": recompute} if recompute else {})})


@pytest.mark.parametrize("tp,sp,recompute,formula", [
    # Table 2 of "Reducing Activation Recomputation in Large Transformer Models", bytes per layer
    (1, False, None, lambda s, b, h, a, t: s * b * h * (34 + 5 * a * s / h)),
    (4, False, None, lambda s, b, h, a, t: s * b * h * (10 + 24 / t + 5 * a * s / (h * t))),
    (4, True, None, lambda s, b, h, a, t: s * b * h / t * (34 + 5 * a * s / h)),
    (4, False, "selective", lambda s, b, h, a, t: s * b * h * (10 + 24 / t)),
    (4, True, "selective", lambda s, b, h, a, t: s * b * h * 34 / t),
    (1, False, "full", lambda s, b, h, a, t: 2 * s * b * h),
])
def test_activations_per_layer_are_korthikantis(tp, sp, recompute, formula):
    cfg = _gpt3_like(tp, sp, recompute)
    got = _layer_activation_bytes(cfg, False, tp, 1, recompute, backend="cuda")
    assert got == pytest.approx(formula(512, 2, 256, 8, tp))


def test_micro_batches_in_flight_under_1f1b_and_interleaving():
    assert [in_flight(4, None, 8, p) for p in range(4)] == [4, 3, 2, 1]
    assert in_flight(4, None, 2, 0) == 2  # no more than a step has
    # interleaved: Megatron's penalty 1 + (PP - 1) / (PP x VPP) on the first stage
    assert in_flight(4, 2, 8, 0) == pytest.approx(4 * (1 + 3 / 8))
    assert stage_layers(8, 2, 2, 1) == [2, 3, 6, 7]


def test_the_largest_stage_and_the_verdict():
    big = _cfg(model={**BENCH_MODEL, "numLayers": 8}, training={"precision": "bf16"})
    fits = estimate(big, 1, device="Ascend 910B", device_bytes=64 * GIB)
    assert fits.verdict == "fits" and "of 64.00 GiB on Ascend 910B" in fits.summary()
    tight = estimate(big, 1, device="tiny", device_bytes=int(fits.largest.total_bytes / 0.95))
    assert tight.verdict == "near"
    assert estimate(big, 1, device="tiny", device_bytes=fits.largest.total_bytes - 1).verdict == "exceeds"
    assert estimate(big, 1).verdict == "unknown"


@pytest.mark.parametrize("devices,selector,name,gib", [
    ({}, {}, "Ascend 910B", 64),
    ({"ringController": "ascend-910"}, {}, "Ascend 910", 32),
    ({}, {"node.kubernetes.io/npu.chip.name": "910B4"}, "Ascend 910B4", 32),
    ({}, {"accelerator-type": "910B3"}, "Ascend 910B3", 64),
    ({"resource": "huawei.com/Ascend910-4c"}, {}, "huawei.com/Ascend910-4c", None),
    ({"resource": "nvidia.com/gpu"}, {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}, "NVIDIA-A100-SXM4-40GB", 40),
    ({"resource": "nvidia.com/gpu"}, {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, "NVIDIA-H100-80GB-HBM3", 80),
    ({"resource": "nvidia.com/gpu"}, {"nvidia.com/gpu.product": "NVIDIA-H200"}, "NVIDIA-H200", 141),
    ({"resource": "nvidia.com/gpu", "memoryGiB": 24}, {}, "nvidia.com/gpu", 24),
    ({"resource": "none"}, {}, None, None),
])
def test_device_memory_by_resource_and_node_label(devices, selector, name, gib):
    got_name, got_bytes = device_memory(TrainDeviceSettings.model_validate(devices), selector)
    assert got_name == name
    assert got_bytes == (None if gib is None else gib * GIB)


def _job(tmp_path, tp: int, pp: int, nproc: int = 8):
    job = {"apiVersion": "ascendtrain.dev/v1alpha1", "kind": "AscendTrainJob", "metadata": {"name": "qwen3-14b"},
           "spec": {"image": "engine:1", "nnodes": 1, "nprocPerNode": nproc,
                    "train": {"model": {"numLayers": 40, "hiddenSize": 5120, "ffnHiddenSize": 17408,
                                        "numAttentionHeads": 40, "groupQueryAttention": True, "numQueryGroups": 8,
                                        "kvChannels": 128, "vocabSize": 151936, "paddedVocabSize": 151936,
                                        "makeVocabSizeDivisibleBy": 1, "qkLayernorm": True},
                              "parallel": {"tensorModelParallelSize": tp, "pipelineModelParallelSize": pp,
                                           "useDistributedOptimizer": True},
                              "training": {"precision": "bf16", "seqLength": 4096, "globalBatchSize": 16}}}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def test_plan_prints_each_stage_and_refuses_what_cannot_fit(tmp_path, capsys):
    assert main(["plan", "-f", str(_job(tmp_path, 2, 4))]) == 0
    out = capsys.readouterr().out
    assert "TP 2 PP 4 DP 1" in out and out.count("\n    ") >= 4 and "fits: stage 0 of 4 needs" in out
    assert main(["plan", "-f", str(_job(tmp_path, 1, 1))]) == 1
    out = capsys.readouterr().out
    assert "refused (InsufficientDeviceMemory)" in out and "of 64.00 GiB on Ascend 910B" in out


def test_validate_and_apply_refuse_a_layout_that_cannot_fit(tmp_path, capsys):
    path = _job(tmp_path, 1, 1)
    assert main(["validate", "-f", str(path)]) == 1
    err = capsys.readouterr().err
    assert "spec.train: InsufficientDeviceMemory: the layout does not fit the device's memory: stage 0 of 1" in err
    # apply refuses before it needs a cluster (none runs at this root)
    assert main(["--root", str(tmp_path), "apply", "-f", str(path)]) == 1
    assert "InsufficientDeviceMemory" in capsys.readouterr().err
    assert main(["validate", "-f", str(_job(tmp_path, 2, 4))]) == 0
    capsys.readouterr()


def test_validate_warns_near_the_edge(tmp_path, capsys):
    path = _job(tmp_path, 2, 4)
    job = yaml.safe_load(path.read_text())
    job["spec"]["devices"] = {"memoryGiB": 60}  # the largest stage needs 55.7 GiB: 93%
    path.write_text(yaml.safe_dump(job))
    assert main(["validate", "-f", str(path)]) == 0
    assert "warning: ascendtrainjob/qwen3-14b: NearDeviceMemory: the layout is near the device's memory" in \
        capsys.readouterr().err


def test_the_operator_warns_once_near_the_edge_and_keeps_the_plan_in_the_status(tmp_path, monkeypatch):
    from ascend_operator.api.train_job import AscendTrainJobSpec
    from ascend_operator.kinds import train_job as handler

    events = []
    monkeypatch.setattr(handler, "kube", lambda: type("K", (), {"post_event": lambda self, *a, **k: events.append(a)})())
    job = yaml.safe_load(_job(tmp_path, 2, 4).read_text())
    job["spec"]["devices"] = {"memoryGiB": 60}
    spec = AscendTrainJobSpec.model_validate(job["spec"])
    obj = {"metadata": {"name": "qwen3-14b", "namespace": "ns", "uid": "u"}, "spec": job["spec"]}
    _, extra = handler.prepare(obj, spec, {})
    assert extra["plan"]["verdict"] == "near" and extra["plan"]["deviceGiB"] == 60
    assert [e[1] for e in events] == ["NearDeviceMemory"]
    handler.prepare(obj, spec, {"plan": extra["plan"]})  # the next reconciles say nothing more
    assert len(events) == 1
