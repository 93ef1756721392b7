"""An AscendTrainJob with an `evaluation:` block: the pods run train then evaluate, the results reach
status.evaluation (and the Eval column), and a failed evaluation fails the job with its cause. Without `train`
the pods only evaluate an existing checkpoint; the API server refuses a job with neither."""
from __future__ import annotations

import json

import pytest
import yaml
from kubernetes import client

from test_operator_train_job import (create, job, operator, patch_pod_status, phase_is,  # noqa: F401 (fixture)
                                     pods_of, wait_for)

pytestmark = pytest.mark.operator

EVALUATION = {"task": ["mmlu", "gsm8k"], "taskDataPath": ["/data/mmlu/test", "/data/gsm8k/test.jsonl"],
              "tokenizerNameOrPath": "/models/qwen3", "shot": 5}


def finish(api_client, namespace, pod_name, exit_code, message):
    """What a kubelet reports when the container ends with a termination message."""
    terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                  "message": json.dumps(message)}
    status = {"phase": "Succeeded" if exit_code == 0 else "Failed", "podIP": "127.0.0.1",
              "containerStatuses": [{"name": "engine", "ready": False, "restartCount": 0, "image": "x",
                                     "imageID": "", "state": {"terminated": terminated}}]}
    patch_pod_status(api_client, namespace, pod_name, status)


def evaluation_job(name):
    body = job(name, evaluation=EVALUATION)
    body["spec"]["train"]["checkpoint"] = {"save": "/ckpt/llm"}
    return body


def test_evaluation_runs_after_training_and_lands_in_the_status(operator, api_client, namespace):
    create(api_client, namespace, evaluation_job("ev"))
    pods = wait_for(lambda: len(p := pods_of(api_client, namespace, "ev")) == 2 and p, what="2 pods")
    config = client.CoreV1Api(api_client).read_namespaced_config_map("ev-config", namespace).data
    evaluation = yaml.safe_load(config["evaluation.yaml"])
    assert evaluation["load"] == "/ckpt/llm" and evaluation["task"] == ["mmlu", "gsm8k"] and evaluation["shot"] == 5
    script = pods[0].spec.containers[0].command
    assert script[:2] == ["sh", "-c"]
    train, evaluate = script[2].split(" && ")
    assert train.endswith("-m ascend_engine train --config /etc/ascendtrain/config.yaml")
    assert evaluate.endswith("-m ascend_engine evaluate --config /etc/ascendtrain/evaluation.yaml")
    assert "--master-port=$((MASTER_PORT + 2))" in evaluate  # not the training store, which may still be closing
    assert pods[1].spec.containers[0].command[-3:-1] == ["sh", "-c"]  # after wait-for-master
    summary = {"summary": "mmlu=0.6200 gsm8k=0.1000", "checkpoint": "/ckpt/llm", "finishedAt": "2026-11-23T15:00:00Z",
               "tasks": [{"task": "mmlu", "accuracy": 0.62, "samples": 14042, "seconds": 900.5},
                         {"task": "gsm8k", "accuracy": 0.1, "samples": 1319, "seconds": 3000.0}]}
    finish(api_client, namespace, "ev-0-0", 0, {"iteration": 10, "loss": 1.5, "evaluation": summary})
    finish(api_client, namespace, "ev-1-0", 0, {})
    status = phase_is(api_client, namespace, "ev", "Succeeded")
    assert status["evaluation"] == summary
    assert status["progress"]["loss"] == 1.5 and "evaluation" not in status["progress"]


def test_a_failed_evaluation_fails_the_job_with_its_cause(operator, api_client, namespace):
    create(api_client, namespace, evaluation_job("evbad"))
    wait_for(lambda: len(pods_of(api_client, namespace, "evbad")) == 2, what="2 pods")
    cause = "bad task data: /data/mmlu/test/anatomy_test.csv:7: expected 6 columns, got 5"
    finish(api_client, namespace, "evbad-0-0", 2, {"reason": "EvaluationFailed", "message": cause})
    status = phase_is(api_client, namespace, "evbad", "Failed")
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "EvaluationFailed" and cause in failed["message"]
    assert status.get("restarts", 0) == 0  # not retried: the data would not get better


LM_EVAL = {"backend": "lm-eval", "task": ["mmlu", "hellaswag", "wikitext"], "includePath": ["/data/lm_eval_tasks"],
           "tokenizerNameOrPath": "/models/qwen3"}


def test_an_evaluation_only_job_evaluates_its_checkpoint_and_succeeds(operator, api_client, namespace):
    """With lm-evaluation-harness's tasks (docs/evaluation.md): the API server takes any task name and the
    backend, and status.evaluation keeps lm-eval's metrics (a perplexity task without an accuracy)."""
    body = job("evonly", evaluation={**LM_EVAL, "load": "/models/qwen3"})
    del body["spec"]["train"]
    create(api_client, namespace, body)
    pods = wait_for(lambda: len(p := pods_of(api_client, namespace, "evonly")) == 2 and p, what="2 pods")
    config = client.CoreV1Api(api_client).read_namespaced_config_map("evonly-config", namespace).data
    assert set(config) == {"evaluation.yaml"} and yaml.safe_load(config["evaluation.yaml"])["load"] == "/models/qwen3"
    command = pods[0].spec.containers[0].command
    assert command[:3] == ["python3", "-m", "ascend_engine.launcher"]
    assert command[-4:] == ["ascend_engine", "evaluate", "--config", "/etc/ascendtrain/evaluation.yaml"]
    assert "train" not in command and "sh" not in pods[1].spec.containers[0].command
    assert yaml.safe_load(config["evaluation.yaml"])["backend"] == "lm-eval"
    summary = {"summary": "mmlu=0.5000 hellaswag=0.2500 wikitext:word_perplexity=31.25", "checkpoint": "/models/qwen3",
               "finishedAt": "2026-11-23T16:00:00Z", "backend": "lm-eval", "seconds": 2.0,
               "tasks": [{"task": "mmlu", "accuracy": 0.5, "metric": "acc,none", "samples": 8,
                          "metrics": {"acc,none": 0.5}},
                         {"task": "hellaswag", "accuracy": 0.25, "metric": "acc,none", "samples": 4,
                          "metrics": {"acc,none": 0.25, "acc_norm,none": 0.5}},
                         {"task": "wikitext", "metric": "word_perplexity,none", "samples": 2,
                          "metrics": {"word_perplexity,none": 31.25, "byte_perplexity,none": 2.5,
                                      "bits_per_byte,none": 1.25}}]}
    finish(api_client, namespace, "evonly-0-0", 0, {"evaluation": summary})
    finish(api_client, namespace, "evonly-1-0", 0, {})
    status = phase_is(api_client, namespace, "evonly", "Succeeded")
    assert status["evaluation"] == summary


def test_the_api_server_refuses_a_job_with_neither_train_nor_evaluation(api_client, namespace):
    body = job("nothing")
    del body["spec"]["train"]
    with pytest.raises(client.ApiException) as err:
        create(api_client, namespace, body)
    assert err.value.status == 422 and "set train, evaluation or both" in err.value.body


def test_the_eval_printer_column():
    from pathlib import Path

    crd = yaml.safe_load((Path(__file__).resolve().parents[2] / "crds" / "ascendtrainjobs.ascendtrain.dev.yaml")
                         .read_text())
    columns = {c["name"]: c["jsonPath"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns["Eval"] == ".status.evaluation.summary"
