"""Restart decisions by exit code, deadline, TTL, cleanPodPolicy and pipeline resolution: pure, no cluster."""
import datetime as dt

import pytest

from ascend_operator.api.group import CHECKPOINT_CONVERT, DATASET_PREP, POD_FINALIZER, TRAIN_JOB
from ascend_operator.api.run_policy import RunPolicy
from ascend_operator.api.single_pod import CheckpointConvertSpec
from ascend_operator.api.train_job import AscendTrainJobSpec
from ascend_operator.lifecycle.dependencies import Ref, cycle, readiness, refs, resolve
from ascend_operator.lifecycle.status import derive

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def pod(index, phase, exit_code=None, **meta):
    status = {"phase": phase}
    if exit_code is not None:
        status["containerStatuses"] = [{"state": {"terminated": {"exitCode": exit_code, "reason": "Error"}}}]
    return {"metadata": {"name": f"j-{index}", "labels": {"ascendtrain.dev/replica-index": str(index)}, **meta},
            "status": status}


CREATED = {"phase": "Running", "conditions": [{"type": "Created", "status": "True", "reason": "Created",
                                               "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}


@pytest.mark.parametrize("code,listed,retryable", [
    (1, [], False), (127, [], False), (3, [3], True), (128, [], True), (137, [], True), (143, [], True),
    (None, [], True),
])
def test_exit_codes_split_into_retryable_and_permanent(code, listed, retryable):
    assert RunPolicy(retryableExitCodes=listed).is_retryable(code) is retryable


def test_retryable_failure_restarts_until_the_backoff_limit():
    policy = RunPolicy(backoffLimit=1)
    first = derive([pod(0, "Running"), pod(1, "Failed", 137)], 2, CREATED, policy, T0)
    assert first["phase"] == "Restarting" and first["restarts"] == 1
    # Old pods terminating, none created yet: still Restarting, no second restart counted.
    gone = derive([pod(0, "Failed", 137, deletionTimestamp="x")], 2, first, policy, T0)
    assert gone["phase"] == "Restarting" and gone["restarts"] == 1
    back = derive([pod(0, "Running"), pod(1, "Running")], 2, gone, policy, T0)
    assert back["phase"] == "Running" and back["restarts"] == 1
    assert {c["type"]: c["status"] for c in back["conditions"]}["Restarting"] == "False"
    again = derive([pod(0, "Failed", 137), pod(1, "Running")], 2, back, policy, T0)
    assert again["phase"] == "Failed" and again["restarts"] == 1
    assert next(c for c in again["conditions"] if c["type"] == "Failed")["reason"] == "BackoffLimitExceeded"


def test_permanent_code_wins_over_a_retryable_one():
    status = derive([pod(0, "Failed", 137), pod(1, "Failed", 2)], 2, CREATED, RunPolicy(backoffLimit=5), T0)
    assert status["phase"] == "Failed" and status.get("restarts", 0) == 0
    assert "exit code 2" in next(c for c in status["conditions"] if c["type"] == "Failed")["message"]


def test_a_pod_deleted_after_it_ran_is_a_failure_not_a_silent_recreation():
    """Deleted after it ran (the operator's finalizer keeps it, with its last status, until counted): the gang
    restarts. Deleted before it ran: the reconcile creates it again, nothing is counted. Missing with no trace
    (never created): created."""
    deleted = pod(1, "Running", deletionTimestamp="2026-01-01T00:00:00Z", finalizers=[POD_FINALIZER])
    status = derive([pod(0, "Running"), deleted], 2, CREATED, RunPolicy(), T0)
    assert status["phase"] == "Restarting" and status["restarts"] == 1
    restarting = next(c for c in status["conditions"] if c["type"] == "Restarting")
    assert restarting["reason"] == "PodDeleted" and "j-1 was deleted while running" in restarting["message"]
    never_ran = pod(1, "Pending", deletionTimestamp="2026-01-01T00:00:00Z", finalizers=[POD_FINALIZER])
    replaced = derive([pod(0, "Running"), never_ran], 2, CREATED, RunPolicy(), T0)
    assert (replaced["phase"], replaced.get("restarts", 0)) == ("Pending", 0)
    waiting = next(c for c in replaced["conditions"] if c["type"] == "Running")["message"]
    assert "1 of 2 pods not created yet; replacing 1 deleted before running" in waiting
    assert derive([pod(0, "Running")], 2, CREATED, RunPolicy(), T0).get("restarts", 0) == 0


def test_deadline_counts_from_pod_creation():
    policy = RunPolicy(activeDeadlineSeconds=60)
    running = [pod(0, "Running")]
    assert derive(running, 1, CREATED, policy, T0 + dt.timedelta(seconds=59))["phase"] == "Running"
    late = derive(running, 1, CREATED, policy, T0 + dt.timedelta(seconds=61))
    assert late["phase"] == "Failed"
    assert next(c for c in late["conditions"] if c["type"] == "Failed")["reason"] == "DeadlineExceeded"


def test_ttl_and_clean_pod_policy():
    policy = RunPolicy(ttlSecondsAfterFinished=30)
    assert not policy.ttl_expired("2026-01-01T00:00:00Z", T0 + dt.timedelta(seconds=29))
    assert policy.ttl_expired("2026-01-01T00:00:00Z", T0 + dt.timedelta(seconds=30))
    assert not RunPolicy().ttl_expired("2026-01-01T00:00:00Z", T0 + dt.timedelta(days=9))
    pods = [pod(0, "Running"), pod(1, "Pending"), pod(2, "Succeeded"), pod(3, "Failed", 1)]
    names = lambda ps: [p["metadata"]["name"] for p in ps]  # noqa: E731
    assert names(RunPolicy(cleanPodPolicy="Running").pods_to_clean(pods)) == ["j-0", "j-1"]
    assert names(RunPolicy(cleanPodPolicy="All").pods_to_clean(pods)) == ["j-0", "j-1", "j-2", "j-3"]
    assert RunPolicy(cleanPodPolicy="None").pods_to_clean(pods) == []


def _train(**spec):
    return AscendTrainJobSpec.model_validate({"image": "x", "train": {"checkpoint": {"save": "/ckpt"}}, **spec})


def _obj(phase, spec=None, outputs=None):
    return {"spec": spec or {}, "status": {"phase": phase, **({"outputs": outputs} if outputs else {})}}


def test_readiness_names_what_it_waits_for():
    prep, conv = Ref(DATASET_PREP, "p", "datasetPrepRef"), Ref(CHECKPOINT_CONVERT, "c", "checkpointConvertRef")
    assert readiness({prep: None, conv: _obj("Running")}) == (
        "Waiting", "waiting for DatasetPrep p (spec.datasetPrepRef) does not exist yet; CheckpointConvert c is Running")
    assert readiness({prep: _obj("Failed"), conv: _obj("Succeeded")})[0] == "Failed"
    assert readiness({prep: _obj("Succeeded"), conv: _obj("Succeeded")})[0] == "Ready"


def test_outputs_become_data_path_and_checkpoint_load():
    spec = _train(datasetPrepRef="p", checkpointConvertRef="c")
    found = {r: None for r in refs(spec)}
    [prep, conv] = found
    alpaca = {"input": "/d/a.jsonl", "tokenizerNameOrPath": "/tok", "outputPrefix": "/d/a", "pack": True,
              "seqLength": 64, "handlerName": "AlpacaStyleInstructionHandler", "promptType": "qwen3"}
    packed = [f"/d/a_packed_{k}_document" for k in ("input_ids", "attention_mask", "labels")]
    found[prep] = _obj("Succeeded", {"prep": alpaca}, {"outputPrefix": "/d/a", "datasets": packed})
    found[conv] = _obj("Succeeded", {"convert": {"saveModelType": "mg", "saveDir": "/mcore"}})
    fresh = resolve(spec, found, {})
    # Instruction data is one dataset named by its bare prefix (MindSpeed-LLM's --data-path), not three.
    assert fresh.train.data.dataPath == ["/d/a"] and fresh.train.data.isInstructionDataset
    assert fresh.train.data.tokenizerNameOrPath == "/tok"  # the prep's tokenizer is the run's
    assert not fresh.train.data.neatPack
    neat = resolve(spec, {**found, prep: _obj("Succeeded", {"prep": {**alpaca, "neatPack": True}}, {})}, {})
    assert neat.train.data.dataPath == ["/d/a"] and neat.train.data.neatPack
    pretrain = {"input": "/d/wiki.jsonl", "tokenizerNameOrPath": "/tok", "outputPrefix": "/d/wiki"}
    text = resolve(spec, {**found, prep: _obj("Succeeded", {"prep": pretrain}, {})}, {})
    assert text.train.data.dataPath == ["/d/wiki_text_document"] and not text.train.data.isInstructionDataset
    assert fresh.train.checkpoint.load == "/mcore" and fresh.train.checkpoint.finetune
    assert spec.train.checkpoint.load is None  # the stored spec is untouched
    # After a restart with a checkpoint of its own, the job resumes from it, not from the converted base.
    resumed = resolve(spec, found, {"progress": {"lastCheckpointIteration": 20}})
    assert resumed.train.checkpoint.load is None and not resumed.train.checkpoint.finetune
    # A conversion to HuggingFace can never feed the job: known as soon as it exists, not after it has run.
    found[conv] = _obj("Pending", {"convert": {"saveModelType": "hf", "saveDir": "/hf"}})
    state, message = readiness(found)
    assert state == "Invalid" and "needs a Megatron one" in message


def test_export_of_a_lora_job_merges_its_adapters_into_its_base():
    spec = CheckpointConvertSpec.model_validate({"image": "x", "trainJobRef": "lora", "convert": {
        "loadModelType": "mg", "saveModelType": "hf", "saveDir": "/out", "modelTypeHf": "qwen3"}})
    [ref] = refs(spec)
    job = {"train": {"checkpoint": {"load": "/base-tp2", "save": "/adapters", "finetune": True},
                     "lora": {"loraR": 8, "loraAlpha": 16, "loraTargetModules": ["linear_qkv", "linear_fc1"]}}}
    merged = resolve(spec, {ref: _obj("Succeeded", job)}, {}).convert.engine_config()
    assert (merged.loadDir, merged.loraLoad) == ("/base-tp2", "/adapters")
    assert (merged.loraR, merged.loraAlpha, merged.loraTargetModules) == (8, 16, ["linear_qkv", "linear_fc1"])
    no_base = {"train": {"checkpoint": {"save": "/adapters"}, "lora": {"loraR": 8}}}
    assert readiness({ref: _obj("Running", no_base)}) == (
        "Invalid", "AscendTrainJob lora trains LoRA adapters but has no train.checkpoint.load: no base to merge into")


def test_export_reads_the_training_jobs_checkpoint():
    spec = CheckpointConvertSpec.model_validate({"image": "x", "trainJobRef": "sft", "convert": {
        "loadModelType": "mg", "saveModelType": "hf", "saveDir": "/out", "modelTypeHf": "qwen3"}})
    [ref] = refs(spec)
    assert ref.kind is TRAIN_JOB
    done = resolve(spec, {ref: _obj("Succeeded", {"train": {"checkpoint": {"save": "/ckpt/sft"}}})}, {})
    assert done.convert.engine_config().loadDir == "/ckpt/sft"
    assert readiness({ref: _obj("Pending", {"train": {}})}) == (
        "Invalid", "AscendTrainJob sft has no train.checkpoint.save: there is no checkpoint to convert")


def test_a_reference_cycle_is_found_and_named():
    """sft waits for CheckpointConvert export, which waits for sft: neither would ever start."""
    spec = _train(checkpointConvertRef="export")
    export = {"spec": {"trainJobRef": "sft", "convert": {"saveModelType": "mg"}}, "status": {"phase": "Pending"}}
    found = {ref: export for ref in refs(spec)}
    assert readiness(found)[0] == "Waiting"
    assert cycle(TRAIN_JOB, "sft", found, lambda ref: None) == (
        "dependency cycle: spec.checkpointConvertRef names CheckpointConvert export, whose spec.trainJobRef names "
        "AscendTrainJob sft, this job: none of them can start until one of the references is removed")
    assert cycle(TRAIN_JOB, "other", found, lambda ref: None) is None  # export waits for sft, not for this job
    # Longer: sft -> export -> pre (another job) -> export: a cycle that does not include sft ends the walk too.
    pre = {"spec": {"checkpointConvertRef": "export"}}
    looping = {ref: {**export, "spec": {**export["spec"], "trainJobRef": "pre"}} for ref in refs(spec)}
    assert cycle(TRAIN_JOB, "sft", looping, lambda ref: pre) is None


def test_a_dpo_job_trains_on_pairwise_outputs_against_the_converted_reference():
    spec = AscendTrainJobSpec.model_validate({"image": "x", "datasetPrepRef": "p", "checkpointConvertRef": "c",
                                              "train": {"stage": "dpo", "checkpoint": {"save": "/ckpt"}}})
    found = {r: None for r in refs(spec)}
    [prep, conv] = found
    pairs = {"input": "/d/p.jsonl", "tokenizerNameOrPath": "/tok", "outputPrefix": "/d/p",
             "handlerName": "AlpacaStylePairwiseHandler", "promptType": "qwen3"}
    found[prep] = _obj("Succeeded", {"prep": pairs}, {"outputPrefix": "/d/p"})
    found[conv] = _obj("Succeeded", {"convert": {"saveModelType": "mg", "saveDir": "/sft-mcore"}})
    fresh = resolve(spec, found, {})
    assert fresh.train.data.dataPath == ["/d/p"] and fresh.train.data.isPairwiseDataset
    assert not fresh.train.data.isInstructionDataset
    assert fresh.train.checkpoint.load == "/sft-mcore" and fresh.train.preference.refModel == "/sft-mcore"
    # A restarted job resumes its own checkpoint, and the reference stays the converted start.
    resumed = resolve(spec, found, {"progress": {"lastCheckpointIteration": 20}})
    assert resumed.train.checkpoint.load is None and resumed.train.preference.refModel == "/sft-mcore"
