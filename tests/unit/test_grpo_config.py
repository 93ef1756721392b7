"""stage grpo's configuration: MindSpeed-RL-like flags over the one GrpoConfig model, the rules a run must meet,
the operator's wiring of R1 prompt data and the reference, and the metrics that reach status.progress."""
from __future__ import annotations

import argparse

import pytest

from ascend_engine.config.train import TrainConfig
from ascend_engine.telemetry import GRPO_METRICS, METRIC_NAMES, preference_fields
from ascend_engine.train import command
from ascend_operator.api.train_job import AscendTrainJobSpec, TrainProgress
from ascend_operator.lifecycle.dependencies import refs, resolve

GRPO = {"stage": "grpo", "data": {"tokenizerNameOrPath": "/tok"}, "grpo": {"maxNewTokens": 16}}


def test_flags_fill_the_grpo_section(tmp_path, monkeypatch):
    path = tmp_path / "job.yaml"
    path.write_text("stage: grpo\ndata:\n  dataPath: [/d/r1]\n")
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    monkeypatch.setenv("WORLD_SIZE", "1")
    cfg = command.load_config(parser.parse_args([
        "--config", str(path), "--tokenizer-name-or-path", "/tok", "--n-samples-per-prompt", "4",
        "--max-new-tokens", "16", "--temperature", "0.7", "--top-p", "0.9", "--kl-coef", "0.01", "--clip-ratio",
        "0.3", "--policy-updates", "2", "--verifier-function", "math", "format", "--verifier-weight", "1", "0.1",
        "--loss-agg-mode", "sequence_mean", "--no-log-entropy", "--reward-model", "/orm", "--reward-model-weight",
        "0.5"]))
    g = cfg.grpo
    assert (g.nSamplesPerPrompt, g.maxNewTokens, g.temperature, g.topP, g.klCoef, g.clipRatio, g.policyUpdates,
            g.lossAggregation, g.logEntropy) == (4, 16, 0.7, 0.9, 0.01, 0.3, 2, "sequence_mean", False)
    assert g.rewards == {"math": 1.0, "format": 0.1}
    assert (g.rewardModel, g.rewardModelWeight) == ("/orm", 0.5)


@pytest.mark.parametrize("change, message", [
    ({"data": {}}, "tokenizerNameOrPath .* is required"),
    ({"grpo": {"maxNewTokens": 64}}, r"maxNewTokens \(64\) .*seqLength"),
    ({"grpo": {**GRPO["grpo"], "verifierFunction": ["accuracy"]}}, "neither a built-in"),
    ({"grpo": {**GRPO["grpo"], "verifierWeight": [1.0, 2.0]}}, "2 weights for 1"),
    ({"data": {"mockData": True, "tokenizerNameOrPath": "/tok"}}, "not mockData"),
    ({"grpo": {**GRPO["grpo"], "verifierFunction": []}}, "nothing would score"),
])
def test_a_grpo_run_that_cannot_work_is_refused(change, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.model_validate({**GRPO, **change})
    assert TrainConfig.model_validate(GRPO).grpo.rewards == {"math": 1.0}
    assert TrainConfig.model_validate({**GRPO, "grpo": {**GRPO["grpo"], "verifierFunction": ["pkg.mod:fn"]}})
    assert TrainConfig.model_validate({**GRPO, "grpo": {**GRPO["grpo"], "verifierFunction": [],
                                                        "rewardModel": "/orm"}}).grpo.rewards == {}


def _obj(spec: dict, outputs: dict | None = None) -> dict:
    return {"spec": spec, "status": {"phase": "Succeeded", "outputs": outputs or {}}}


def test_operator_wires_r1_prompts_and_the_reference():
    spec = AscendTrainJobSpec.model_validate({"image": "x", "datasetPrepRef": "p", "checkpointConvertRef": "c",
                                              "train": {**GRPO, "checkpoint": {"save": "/ckpt"}}})
    found = {r: None for r in refs(spec)}
    prep, conv = found
    r1 = {"input": "/d/a.jsonl", "tokenizerNameOrPath": "/tok", "outputPrefix": "/d/a",
          "handlerName": "R1AlpacaStyleInstructionHandler", "promptType": "qwen_r1"}
    found[prep] = _obj({"prep": r1}, {"outputPrefix": "/d/a"})
    found[conv] = _obj({"convert": {"saveModelType": "mg", "saveDir": "/sft-mcore"}})
    resumed = resolve(spec, found, {"progress": {"lastCheckpointIteration": 5}})
    assert resumed.train.data.dataPath == ["/d/a"]
    assert resumed.train.preference.refModel == "/sft-mcore"  # the start stays the reference after a restart


def test_every_grpo_metric_has_a_status_field():
    fields = set(TrainProgress.model_fields)
    assert set(GRPO_METRICS.values()) <= fields and set(GRPO_METRICS.values()) <= set(METRIC_NAMES.values())
    step = {"lm loss": 0.1, "grpo/reward_mean": 0.5, "grpo/accuracy": 0.25, "timing/rollout_s": 1.5,
            "grpo/reward_model_score": -0.75}
    assert preference_fields(step) == {"rewardMean": 0.5, "accuracy": 0.25, "rolloutSeconds": 1.5,
                                       "rewardModelScore": -0.75}


def test_grpo_figures_reach_the_job_status_through_the_endpoint():
    import socket

    from ascend_engine.telemetry import Metrics
    from ascend_operator.progress.scrape import scrape

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    metrics = Metrics()
    metrics.serve(port, "127.0.0.1")
    step = {"lm loss": -0.01, "grpo/reward_mean": 0.625, "grpo/reward_std": 0.5, "grpo/accuracy": 0.5,
            "grpo/response_length": 12.0, "grpo/kl": 0.001, "grpo/clip_fraction": 0.125, "grpo/entropy": 2.5,
            "grpo/policy_loss": -0.02, "timing/rollout_s": 3.0, "timing/update_s": 1.0,
            "tokens_per_s/rollout": 100.0, "tokens_per_s/update": 400.0}
    metrics.set(iteration=4, loss=step["lm loss"], **preference_fields(step))
    progress = TrainProgress.model_validate(scrape(f"http://127.0.0.1:{port}/metrics"))
    assert (progress.rewardMean, progress.rewardStd, progress.accuracy, progress.responseLength, progress.kl,
            progress.clipFraction, progress.entropy, progress.rolloutSeconds, progress.updateSeconds,
            progress.rolloutTokensPerSecond, progress.updateTokensPerSecond) == \
        (0.625, 0.5, 0.5, 12.0, 0.001, 0.125, 2.5, 3.0, 1.0, 100.0, 400.0)
