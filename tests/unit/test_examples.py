"""Every example under examples/ is accepted by the models (kube-apiserver's verdict, the CRD schema with its CEL
rules, is tests/operator/test_manifests_on_the_server.py's); pipelines are wired the way the seeds' pitfalls
require."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from ascend_engine.config.prep import PrepConfig
from ascend_engine.prep.encode import output_keys
from ascend_operator.api.group import API_GROUP, API_VERSION
from ascend_operator.api.resources import RESOURCES

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FILES = sorted(p.name for p in EXAMPLES.glob("*.yaml"))


def documents(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def ours(name: str) -> list[dict]:
    """The example's resources of our API group (an example may also carry the claim its pods mount)."""
    return [d for d in documents(name) if d["apiVersion"] == f"{API_GROUP}/{API_VERSION}"]


def test_the_examples_the_issue_asks_for_are_there():
    assert {"quickstart.yaml", "qwen3-1.7b-pretrain-pp2.yaml", "qwen3-14b-sft-alpaca-tp2pp4.yaml",
            "qwen3-14b-lora-sft-merge-export.yaml", "qwen3-14b-pretrain-2x8.yaml"} <= set(FILES)


@pytest.mark.parametrize("name", FILES)
def test_example_validates_against_the_models(name):
    assert ours(name)
    for doc in documents(name):
        if doc["apiVersion"] != f"{API_GROUP}/{API_VERSION}":
            assert (doc["apiVersion"], doc["kind"]) == ("v1", "PersistentVolumeClaim"), doc["metadata"]
            continue
        RESOURCES[doc["kind"]].spec.model_validate(doc["spec"])


def _by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


@pytest.mark.parametrize("name", FILES)
def test_pipeline_wiring_follows_the_seeds_pitfalls(name):
    """Conversion TP/PP equals training's where the job loads that conversion; dataPath is a prefix the
    prep job really writes (`<prefix>_text_document` for pretraining, the bare prefix for instruction data)."""
    docs = documents(name)
    converts = {c["metadata"]["name"]: c["spec"]["convert"] for c in _by_kind(docs, "CheckpointConvert")}
    conversions = {c["saveDir"]: c for c in converts.values()}
    preps = {p["metadata"]["name"]: PrepConfig.model_validate(p["spec"]["prep"]) for p in _by_kind(docs, "DatasetPrep")}
    for job in _by_kind(docs, "AscendTrainJob"):
        train = job["spec"].get("train", {})  # evaluation-only jobs have none
        # A job loads a conversion by path, or by reference (the operator then wires its saveDir).
        ref = job["spec"].get("checkpointConvertRef")
        loaded = converts[ref] if ref else conversions.get(train.get("checkpoint", {}).get("load"))
        if loaded is not None:
            parallel = train["parallel"]
            assert (loaded.get("targetTensorParallelSize", 1), loaded.get("targetPipelineParallelSize", 1),
                    loaded.get("targetExpertParallelSize", 1)) == \
                (parallel.get("tensorModelParallelSize", 1), parallel.get("pipelineModelParallelSize", 1),
                 parallel.get("expertModelParallelSize", 1))
        if job["spec"].get("datasetPrepRef"):  # the operator turns the prep's outputs into dataPath
            assert job["spec"]["datasetPrepRef"] in preps
            continue
        for prep in preps.values():
            written = [f"{prep.outputPrefix}_{key}_document" for key in output_keys(prep)]
            expected = written if prep.is_pretrain else [prep.outputPrefix]
            mine = [p for p in train.get("data", {}).get("dataPath", []) if p.startswith(prep.outputPrefix)]
            assert mine and set(mine) <= set(expected), (mine, expected)
    jobs = {j["metadata"]["name"]: j for j in _by_kind(docs, "AscendTrainJob")}
    saved = {j["spec"].get("train", {}).get("checkpoint", {}).get("save") for j in jobs.values()}
    for convert in _by_kind(docs, "CheckpointConvert"):
        spec = convert["spec"]
        if spec["convert"]["saveModelType"] == "hf" and (spec.get("trainJobRef") in jobs
                                                         or spec["convert"].get("loadDir") in saved):
            assert spec["convert"].get("modelTypeHf"), "an export to HF names the model family"


def test_multi_node_example_is_two_by_eight_npus():
    (job,) = _by_kind(documents("qwen3-14b-pretrain-2x8.yaml"), "AscendTrainJob")
    spec = RESOURCES["AscendTrainJob"].spec.model_validate(job["spec"])
    assert (spec.nnodes, spec.nprocPerNode, spec.runtimeRef.name) == (2, 8, "ascend-910b")
    assert spec.train.check_world_size(spec.world_size) == 2


def test_moe_example_splits_experts_over_expert_parallel_ranks():
    """Qwen3-30B-A3B: 16 NPUs hold TP2 x PP2 x EP4 expert layers; 128 experts, 32 per EP rank."""
    (job,) = _by_kind(documents("qwen3-30b-a3b-sft-tp2pp2ep4.yaml"), "AscendTrainJob")
    spec = RESOURCES["AscendTrainJob"].spec.model_validate(job["spec"])
    assert spec.world_size == 16 and spec.train.check_world_size(spec.world_size) == 4
    assert spec.train.model.numExperts // spec.train.parallel.expertModelParallelSize == 32
    job["spec"]["train"]["parallel"]["expertModelParallelSize"] = 8  # 2 x 2 x 8 = 32 ranks > 16
    with pytest.raises(ValidationError, match="expertModelParallelSize"):
        RESOURCES["AscendTrainJob"].spec.model_validate(job["spec"])


def test_a_broken_example_is_caught():
    """The model refuses what `kubectl apply` would: 3 NPUs cannot hold TP2."""
    (job,) = _by_kind(documents("qwen3-1.7b-pretrain-pp2.yaml"), "AscendTrainJob")
    job["spec"]["nprocPerNode"] = 3
    with pytest.raises(ValidationError, match="nnodes x nprocPerNode"):
        RESOURCES["AscendTrainJob"].spec.model_validate(job["spec"])


def test_no_two_examples_share_an_object_or_an_output():
    """All examples can run in one namespace at once: no object name, and no path written on the same volume,
    is used twice (pipeline-dpo.yaml once reused pipeline.yaml's sft with another spec). The pipelines' workspace
    claim is the one object several examples carry, word for word: applying them together creates it once."""
    names, outputs = {}, {}
    for name in FILES:
        for doc in documents(name):
            key = (doc["kind"], doc["metadata"].get("namespace", "default"), doc["metadata"]["name"])
            if key in names:
                assert doc["kind"] == "PersistentVolumeClaim" and doc == names[key][1], \
                    f"{name} and {names[key][0]} both define {key}"
                continue
            names[key] = (name, doc)
            spec = doc["spec"]
            claims = tuple(v["persistentVolumeClaim"]["claimName"] for v in spec.get("volumes", [])
                           if "persistentVolumeClaim" in v)
            for path in ((spec.get("prep") or {}).get("outputPrefix"), (spec.get("convert") or {}).get("saveDir"),
                         ((spec.get("train") or {}).get("checkpoint") or {}).get("save")):
                if path:
                    assert (claims, path) not in outputs, f"{name} and {outputs[(claims, path)]} both write {path}"
                    outputs[(claims, path)] = name
