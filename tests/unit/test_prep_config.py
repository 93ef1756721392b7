"""PrepConfig: MindSpeed-LLM flags, a DatasetPrep resource's spec.prep, errors with file and line."""
from __future__ import annotations

import argparse

import pytest

from ascend_engine.config.loader import ConfigError, add_flags, build_config
from ascend_engine.config.prep import PrepConfig


def load(argv: list[str], config: str | None = None) -> PrepConfig:
    parser = argparse.ArgumentParser()
    dests = add_flags(parser, PrepConfig)
    return build_config(PrepConfig, parser.parse_args(argv), dests, config, section="prep")


def test_mindspeed_flags_parse():
    cfg = load(["--input", "a.parquet", "--tokenizer-name-or-path", "/tok", "--tokenizer-type", "PretrainedFromHF",
                "--output-prefix", "/out/alpaca", "--handler-name", "SharegptStyleInstructionHandler",
                "--prompt-type", "qwen", "--map-keys", '{"messages":"chat"}', "--seq-length", "4096", "--pack",
                "--neat-pack", "--workers", "4", "--n-subs", "2", "--log-interval", "1000", "--on-error", "skip"])
    assert cfg.mapKeys == {"messages": "chat"} and cfg.packing and cfg.neatPack and cfg.workers == 4
    assert cfg.to_yaml_dict()["tokenizerNameOrPath"] == "/tok"
    assert PrepConfig.model_json_schema()["properties"]["seqLength"]["description"].startswith("Longest sample")


def test_datasetprep_resource_and_errors_with_lines(tmp_path):
    resource = tmp_path / "dsp.yaml"
    resource.write_text(
        "apiVersion: ascendtrain.dev/v1alpha1\nkind: DatasetPrep\nmetadata:\n  name: alpaca\nspec:\n  prep:\n"
        "    input: /data/alpaca.parquet\n    tokenizerNameOrPath: /models/qwen3\n    outputPrefix: /data/alpaca\n"
        "    handlerName: AlpacaStyleInstructionHandler\n    promptType: qwen3\n    mapKeys: {system: sys}\n")
    cfg = load(["--workers", "2"], str(resource))
    assert cfg.promptType == "qwen3" and cfg.mapKeys == {"system": "sys"} and cfg.workers == 2
    resource.write_text(resource.read_text().replace("promptType: qwen3", "promptType: qwen3\n    workers: 0"))
    with pytest.raises(ConfigError, match=r"dsp.yaml:12: spec.prep.workers: Input should be greater"):
        load([], str(resource))


@pytest.mark.parametrize("argv, message", [
    (["--handler-name", "AlpacaStyleInstructionHandler"], "promptType is required"),
    (["--handler-name", "AlpacaStyleInstructionHandler", "--prompt-type", "vicuna9"], "unknown promptType 'vicuna9'"),
    (["--handler-name", "AlpacaStyleInstructionHandler", "--prompt-type", "qwen", "--pack"], "need seqLength"),
    (["--pack", "--seq-length", "8"], "apply to instruction data"),
    (["--map-keys", "[1]"], "must be a JSON object"),
])
def test_inconsistent_settings_are_rejected(argv, message):
    with pytest.raises(ConfigError, match=message):
        load(["--input", "a.jsonl", "--tokenizer-name-or-path", "/tok", "--output-prefix", "/o", *argv])
