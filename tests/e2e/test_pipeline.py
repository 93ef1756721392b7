"""examples/pipeline.yaml from one apply on the local cluster: prep -> hf2mcore -> SFT -> mcore2hf, ordered by the
operator, ending with a HuggingFace model that transformers loads and runs. The SFT job's evaluation block runs
lm-eval's own hellaswag (choices) and gsm8k (generation) on the trained checkpoint, their hub datasets from tiny
local copies in the workspace (``datasetsDir``). (lm-eval's mmlu group, 57 subjects, and its aggregate in the
status are tests/engine/test_lm_eval_parity.py's, against lm-eval's HF backend.)"""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ascend_cluster.cluster import LocalCluster


pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from lm_eval_datasets import write_lm_eval_datasets  # noqa: E402

# lm-eval's task names, its task definitions; gsm8k names no max_gen_toks and the tiny model has 128 positions
EVALUATION = {"task": ["hellaswag", "gsm8k"], "backend": "lm-eval", "datasetsDir": "/workspace/data/hub",
              "tokenizerNameOrPath": "/workspace/models/tiny-qwen3", "maxNewTokens": 16}


def test_pipeline_runs_in_dependency_order_and_exports_a_loadable_model(tmp_path):
    docs = [d for d in yaml.safe_load_all((EXAMPLES / "pipeline.yaml").read_text()) if d]
    names = [(d["kind"], d["metadata"]["name"]) for d in docs if d["apiVersion"].startswith("ascendtrain.dev/")]
    sft = next(d for d in docs if d["kind"] == "AscendTrainJob" and d["metadata"]["name"] == "sft")
    sft["spec"]["evaluation"] = EVALUATION
    with LocalCluster(fast_storage=True, root=tmp_path / "cluster", operator=True) as cluster:
        resources = cluster.client()
        for doc in docs:  # the claim first: its directory is where the assets go
            resources.apply(doc)
            if doc["kind"] == "PersistentVolumeClaim":
                workspace = cluster.root / "pvc" / "default" / "ascend-workspace"
                subprocess.run([sys.executable, str(EXAMPLES / "make_tiny_assets.py"), str(workspace)], check=True,
                               capture_output=True)
                write_lm_eval_datasets(workspace / "data" / "hub")
        kinds = {kind: resources.resolve(kind) for kind, _ in names}
        statuses: dict[str, dict] = {}
        waited_for_dependencies = False
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            statuses = {name: resources.get(kinds[kind], name, "default").get("status") or {} for kind, name in names}
            sft = statuses["sft"]
            if any(c.get("type") == "DependenciesReady" and c.get("status") == "False"
                   for c in sft.get("conditions", [])) and statuses["alpaca-prep"].get("phase") != "Succeeded":
                waited_for_dependencies = True
            if any(s.get("phase") == "Failed" for s in statuses.values()):
                break
            if all(s.get("phase") == "Succeeded" for s in statuses.values()):
                break
            time.sleep(1)
        log = cluster.operator_log.read_text()[-3000:]
        resources.close()
    assert all(s.get("phase") == "Succeeded" for s in statuses.values()), f"{yaml.safe_dump(statuses)}\n{log}"
    assert waited_for_dependencies, "the SFT job should have waited for its DatasetPrep and CheckpointConvert"
    prep = statuses["alpaca-prep"]["outputs"]
    assert prep["records"]["read"] == prep["records"]["written"] == 32 and prep["tokens"] > 0
    assert statuses["qwen3-hf2mcore"]["outputs"]["tensorModelParallelSize"] == 2
    progress = statuses["sft"]["progress"]
    assert progress["iteration"] == progress["trainIters"] and math.isfinite(progress["loss"])
    # It learned from the packed instruction data: well below a random model's ln(vocab) = ln(320) ~ 5.77.
    assert progress["loss"] < 5.0
    # The evaluation block ran lm-eval's tasks after training on the same two pods (TP2) and reported lm-eval's
    # metrics per requested task: hellaswag's acc and acc_norm, gsm8k's exact match under both of its filters.
    evaluation = statuses["sft"]["evaluation"]
    assert evaluation["backend"] == "lm-eval" and evaluation["finishedAt"]
    tasks = {t["task"]: t for t in evaluation["tasks"]}
    assert list(tasks) == ["hellaswag", "gsm8k"], evaluation
    assert set(tasks["hellaswag"]["metrics"]) == {"acc,none", "acc_norm,none"} and tasks["hellaswag"]["samples"] == 2
    assert set(tasks["gsm8k"]["metrics"]) == {"exact_match,strict-match", "exact_match,flexible-extract"}
    assert all(0.0 <= v <= 1.0 for t in tasks.values() for v in t["metrics"].values())
    results = json.loads((workspace / "checkpoints" / "sft" / "evaluation_results.json").read_text())
    assert {"hellaswag", "gsm8k"} <= set(results["results"])  # lm-eval's document
    # read from the local copy (the pod's path; the local cluster's pods see it as a host path)
    assert results["configs"]["gsm8k"]["dataset_path"].endswith("/data/hub/openai/gsm8k")

    # The exported model is a HuggingFace model again.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    exported = workspace / "models" / "tiny-qwen3-sft"
    model = AutoModelForCausalLM.from_pretrained(exported)
    tokenizer = AutoTokenizer.from_pretrained(exported)
    ids = tokenizer("What is the capital of France?", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert torch.isfinite(logits).all()
