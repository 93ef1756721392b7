"""Every lifecycle transition, with the operator as a real process against the session's kube-apiserver.

The test plays the kubelet (patching pod status and exit codes), exactly as a cluster would report them.
"""
from __future__ import annotations

import json
import re
import time

import pytest
from kubernetes import client

from test_operator_train_job import (GROUP, PLURAL, VERSION, create, get_job, job, operator,  # noqa: F401
                                     patch_pod_status, phase_is, pods_of, set_pod_phase, wait_for)

pytestmark = pytest.mark.operator


def run_all(api_client, namespace, name, n=2, attempt=0):
    for i in range(n):
        set_pod_phase(api_client, namespace, f"{name}-{i}-{attempt}", "Running")


def events_of(api_client, namespace, name):
    """The job's events in the order they were recorded (a list is not ordered by time)."""
    items = client.CoreV1Api(api_client).list_namespaced_event(namespace).items
    items.sort(key=lambda e: int(e.metadata.resource_version))
    return [(e.reason, e.message) for e in items if e.involved_object.name == name]


def test_retryable_exit_code_restarts_the_whole_gang_and_counts_it(operator, api_client, namespace):
    create(api_client, namespace, job("rt", runPolicy={"backoffLimit": 2},
                                      train={"parallel": {"tensorModelParallelSize": 2},
                                             "checkpoint": {"save": "/ckpt/rt", "saveInterval": 5}}))
    first = wait_for(lambda: len(p := pods_of(api_client, namespace, "rt")) == 2 and p, what="pods")
    config = client.CoreV1Api(api_client).read_namespaced_config_map("rt-config", namespace).data["config.yaml"]
    assert "load: /ckpt/rt" in config  # the restarted engine resumes from its own checkpoints
    run_all(api_client, namespace, "rt")
    phase_is(api_client, namespace, "rt", "Running")
    set_pod_phase(api_client, namespace, "rt-1-0", "Failed", exit_code=137)  # SIGKILL: OOM kill, node loss
    restarting = phase_is(api_client, namespace, "rt", "Restarting")
    assert restarting["restarts"] == 1
    cond = next(c for c in restarting["conditions"] if c["type"] == "Restarting")
    assert cond["status"] == "True" and "gang restart 1/2" in cond["message"] and "exit code 137" in cond["message"]
    # The next attempt's pods have names of their own; the failed pod stays (its log with it), the running one
    # of the stopped gang is deleted.
    second = wait_for(lambda: (p := pods_of(api_client, namespace, "rt")) and [x.metadata.name for x in p] == [
        "rt-0-1", "rt-1-0", "rt-1-1"] and p, what="the next attempt's pods")
    attempts = {x.metadata.name: (x.metadata.labels["ascendtrain.dev/attempt"], x.status.phase) for x in second}
    assert attempts == {"rt-0-1": ("1", "Pending"), "rt-1-1": ("1", "Pending"), "rt-1-0": ("0", "Failed")}
    assert next(x for x in second if x.metadata.name == "rt-1-0").metadata.uid == \
        next(x for x in first if x.metadata.name == "rt-1-0").metadata.uid
    assert next(x for x in second if x.metadata.name == "rt-0-1").spec.hostname == "rt-0"  # MASTER_ADDR's name
    run_all(api_client, namespace, "rt", attempt=1)
    running = phase_is(api_client, namespace, "rt", "Running")
    assert running["restarts"] == 1
    assert {c["type"]: c["status"] for c in running["conditions"]}["Restarting"] == "False"
    assert any(reason == "GangRestart" for reason, _ in events_of(api_client, namespace, "rt"))
    import urllib.request
    served = urllib.request.urlopen(operator.metrics_url, timeout=5).read().decode()
    assert 'ascend_operator_gang_restarts_total{kind="AscendTrainJob",reason="PodFailed"} 1.0' in served
    # this job at least: the operator also follows jobs of earlier tests whose namespaces are still being deleted
    running_jobs = re.search(r'^ascend_operator_jobs\{kind="AscendTrainJob",phase="Running"\} (\S+)$', served, re.M)
    assert running_jobs and float(running_jobs.group(1)) >= 1, served
    assert "ascend_operator_reconcile_seconds_count" in served
    # The restart asked nothing the server had to refuse: no second create of the Service (or a PodGroup) the job
    # already has (409), no finalizer patch of a pod already gone (404).
    refused = re.findall(r'^ascend_operator_api_errors_total\{code="(\d+)"\} (\S+)$', served, re.M)
    assert not [code for code, count in refused if code in ("404", "409") and float(count)], refused
    # A deleted pod is not silently recreated: the policy restarts the gang (restart 2 of 2) ...
    client.CoreV1Api(api_client).delete_namespaced_pod("rt-0-1", namespace)
    assert phase_is(api_client, namespace, "rt", "Restarting")["restarts"] == 2
    wait_for(lambda: {p.metadata.name for p in pods_of(api_client, namespace, "rt")} == {"rt-1-0", "rt-0-2", "rt-1-2"},
             what="pods again (backoffLimit 2: up to 3 attempts kept)")
    # ... and the next failure exceeds backoffLimit.
    set_pod_phase(api_client, namespace, "rt-0-2", "Failed", exit_code=143)
    failed = phase_is(api_client, namespace, "rt", "Failed")
    assert next(c for c in failed["conditions"] if c["type"] == "Failed")["reason"] == "BackoffLimitExceeded"
    # cleanPodPolicy Running (the default): no zombie left holding devices; each attempt's failed pod stays.
    wait_for(lambda: {p.metadata.name for p in pods_of(api_client, namespace, "rt")} == {"rt-1-0", "rt-0-2"},
             what="running pods cleaned, failed ones kept")


def test_permanent_exit_code_fails_without_retry(operator, api_client, namespace):
    create(api_client, namespace, job("perm", runPolicy={"backoffLimit": 5, "cleanPodPolicy": "All"}))
    wait_for(lambda: len(pods_of(api_client, namespace, "perm")) == 2, what="pods")
    run_all(api_client, namespace, "perm")
    set_pod_phase(api_client, namespace, "perm-0-0", "Failed", exit_code=1)
    failed = phase_is(api_client, namespace, "perm", "Failed")
    assert failed.get("restarts", 0) == 0
    message = next(c for c in failed["conditions"] if c["type"] == "Failed")["message"]
    assert "exit code 1" in message and "permanent" in message
    wait_for(lambda: pods_of(api_client, namespace, "perm") == [], what="cleanPodPolicy All")


def test_listed_exit_code_is_retried(operator, api_client, namespace):
    create(api_client, namespace, job("listed", runPolicy={"retryableExitCodes": [3]}))
    wait_for(lambda: len(pods_of(api_client, namespace, "listed")) == 2, what="pods")
    set_pod_phase(api_client, namespace, "listed-1-0", "Failed", exit_code=3)
    assert phase_is(api_client, namespace, "listed", "Restarting")["restarts"] == 1


def test_suspend_removes_pods_and_resume_recreates_them(operator, api_client, namespace):
    custom = client.CustomObjectsApi(api_client)
    create(api_client, namespace, job("sus", runPolicy={"suspend": True}))
    suspended = phase_is(api_client, namespace, "sus", "Suspended")
    assert pods_of(api_client, namespace, "sus") == []  # Kueue-style: created suspended, no pods until admitted
    assert {c["type"]: c["status"] for c in suspended["conditions"]}["Suspended"] == "True"
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "sus",
                                          {"spec": {"runPolicy": {"suspend": False}}})
    wait_for(lambda: len(pods_of(api_client, namespace, "sus")) == 2, what="pods after resume")
    run_all(api_client, namespace, "sus")
    phase_is(api_client, namespace, "sus", "Running")
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "sus",
                                          {"spec": {"runPolicy": {"suspend": True}}})
    phase_is(api_client, namespace, "sus", "Suspended")
    wait_for(lambda: pods_of(api_client, namespace, "sus") == [], what="pods removed")
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "sus",
                                          {"spec": {"runPolicy": {"suspend": False}}})
    wait_for(lambda: len(pods_of(api_client, namespace, "sus")) == 2, what="pods after second resume")
    resumed = phase_is(api_client, namespace, "sus", "Pending")  # the status follows the pods' creation
    assert resumed.get("restarts", 0) == 0
    reasons = [r for r, _ in events_of(api_client, namespace, "sus")]
    assert "Suspended" in reasons and "Pending" in reasons


def test_ttl_deletes_the_finished_job_and_what_it_created(operator, api_client, namespace):
    created = create(api_client, namespace, job("ttl", runPolicy={"ttlSecondsAfterFinished": 1,
                                                                  "cleanPodPolicy": "None"}))
    assert not created["metadata"].get("finalizers")
    wait_for(lambda: len(pods_of(api_client, namespace, "ttl")) == 2, what="pods")
    assert not get_job(api_client, namespace, "ttl")["metadata"].get("finalizers")  # deletion never waits for us
    for i in range(2):
        set_pod_phase(api_client, namespace, f"ttl-{i}-0", "Succeeded", exit_code=0)
    custom = client.CustomObjectsApi(api_client)
    wait_for(lambda: not any(o["metadata"]["name"] == "ttl" for o in
                             custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]),
             what="job deleted after its TTL")
    wait_for(lambda: pods_of(api_client, namespace, "ttl") == [], what="pods collected with their owner")
    reasons = [r for r, _ in events_of(api_client, namespace, "ttl")]
    assert reasons.index("Succeeded") < reasons.index("Deleted")


def test_a_finished_job_stays_finished_and_keeps_no_running_pods(operator, api_client, namespace):
    """Whoever marks a job finished (here a status write by hand), its running pods go as its cleanPodPolicy says,
    as they would had the operator finished it; and a finished phase cannot be taken back."""
    create(api_client, namespace, job("fin"))
    wait_for(lambda: len(pods_of(api_client, namespace, "fin")) == 2, what="pods")
    run_all(api_client, namespace, "fin")
    phase_is(api_client, namespace, "fin", "Running")
    custom = client.CustomObjectsApi(api_client)
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "fin", {"status": {
        "phase": "Succeeded", "completionTime": "2026-01-01T00:00:00Z"}})
    wait_for(lambda: pods_of(api_client, namespace, "fin") == [], what="the running pods of the finished job deleted")
    with pytest.raises(client.ApiException) as refused:
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "fin",
                                                     {"status": {"phase": "Running"}})
    assert refused.value.status == 422
    assert "status.phase: Forbidden: a Succeeded or Failed job stays so" in refused.value.body
    # runPolicy may change after the end (a TTL added): the status observes the new generation, so kstatus (Flux's
    # and Argo CD's waits) calls the job Current, and the job stays as it ended.
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "fin",
                                          {"spec": {"runPolicy": {"ttlSecondsAfterFinished": 10**8}}})
    observed = wait_for(lambda: (s := get_job(api_client, namespace, "fin")["status"]).get(
        "observedGeneration") == 2 and s, what="the new generation observed")
    assert (observed["phase"], observed["completionTime"]) == ("Succeeded", "2026-01-01T00:00:00Z")
    assert {c["type"]: c["status"] for c in observed["conditions"]}["Ready"] == "True"


def test_active_deadline_fails_the_job(operator, api_client, namespace):
    create(api_client, namespace, job("late", runPolicy={"activeDeadlineSeconds": 2}))
    failed = phase_is(api_client, namespace, "late", "Failed")
    assert next(c for c in failed["conditions"] if c["type"] == "Created")["status"] == "True"
    assert next(c for c in failed["conditions"] if c["type"] == "Failed")["reason"] == "DeadlineExceeded"
    wait_for(lambda: pods_of(api_client, namespace, "late") == [], what="pending pods cleaned")


def test_worker_that_never_reaches_the_master_gives_a_clear_condition(operator, api_client, namespace):
    create(api_client, namespace, job("lonely", runPolicy={"backoffLimit": 0}, masterWaitSeconds=5))
    pods = wait_for(lambda: len(p := pods_of(api_client, namespace, "lonely")) == 2 and p, what="pods")
    assert pods[1].spec.containers[0].command[:2] == ["ascend-engine", "wait-for-master"]
    master = f"lonely-0.lonely.{namespace}.svc"
    report = json.dumps({"status": "Failed", "reason": "MasterUnreachable",
                         "message": f"master {master}:29500 not reachable after 5s: {master} does not resolve"})
    status = {"phase": "Failed", "containerStatuses": [{
        "name": "engine", "ready": False, "restartCount": 0, "image": "x", "imageID": "",
        "state": {"terminated": {"exitCode": 124, "reason": "Error", "message": report}}}]}
    patch_pod_status(api_client, namespace, "lonely-1-0", status)
    failed = phase_is(api_client, namespace, "lonely", "Failed")
    cond = next(c for c in failed["conditions"] if c["type"] == "Failed")
    assert cond["reason"] == "MasterUnreachable" and "does not resolve" in cond["message"]


def _prep(name):
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "DatasetPrep", "metadata": {"name": name},
            "spec": {"image": "engine:test", "prep": {"input": "/data/raw.jsonl", "outputPrefix": "/data/alpaca",
                                                      "tokenizerNameOrPath": "/models/tok"}}}


def _convert(name, **spec):
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CheckpointConvert", "metadata": {"name": name},
            "spec": {"image": "engine:test", **spec}}


def _succeed_single_pod(api_client, namespace, name, outputs):
    import json
    status = {"phase": "Succeeded", "containerStatuses": [{
        "name": "engine", "ready": False, "restartCount": 0, "image": "x", "imageID": "",
        "state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": json.dumps(outputs)}}}]}
    patch_pod_status(api_client, namespace, f"{name}-0-0", status)


def test_pipeline_waits_for_its_dependencies_then_uses_their_outputs(operator, api_client, namespace):
    sft = job("sft", datasetPrepRef="prep", checkpointConvertRef="hf2mg",
              train={"parallel": {"tensorModelParallelSize": 2}, "checkpoint": {"save": "/ckpt/sft"}})
    create(api_client, namespace, sft)
    waiting = phase_is(api_client, namespace, "sft", "Pending")
    cond = wait_for(lambda: next((c for c in get_job(api_client, namespace, "sft")["status"]["conditions"]
                                  if c["type"] == "DependenciesReady"), None), what="DependenciesReady")
    assert cond["status"] == "False" and "DatasetPrep prep (spec.datasetPrepRef) does not exist yet" in cond["message"]
    assert waiting and pods_of(api_client, namespace, "sft") == []
    create(api_client, namespace, _prep("prep"), "datasetpreps")
    create(api_client, namespace, _convert("hf2mg", convert={"loadDir": "/models/hf", "saveDir": "/ckpt/mcore"}),
           "checkpointconverts")
    export = _convert("mg2hf", trainJobRef="sft", convert={"loadModelType": "mg", "saveModelType": "hf",
                                                           "saveDir": "/models/out", "modelTypeHf": "qwen3"})
    create(api_client, namespace, export, "checkpointconverts")
    wait_for(lambda: len(pods_of(api_client, namespace, "prep")) == 1, what="prep pod")
    _succeed_single_pod(api_client, namespace, "prep", {"status": "Succeeded", "outputPrefix": "/data/alpaca",
                                             "datasets": ["/data/alpaca_packed"], "records": {"read": 52}})
    prepped = phase_is(api_client, namespace, "prep", "Succeeded", "datasetpreps")
    # `kubectl get dsp` shows Done/Percent from the engine's report even when no scrape caught it running.
    assert (prepped["progress"]["done"], prepped["progress"]["percent"]) == (52, 100.0)
    time.sleep(1.5)
    assert pods_of(api_client, namespace, "sft") == []  # still waiting for the conversion
    _succeed_single_pod(api_client, namespace, "hf2mg", {"status": "Succeeded", "layers": 2})
    converted = phase_is(api_client, namespace, "hf2mg", "Succeeded", "checkpointconverts")
    assert (converted["progress"]["done"], converted["progress"]["percent"]) == (2, 100.0)
    wait_for(lambda: len(pods_of(api_client, namespace, "sft")) == 2, what="training pods once both succeeded")
    import yaml
    config = yaml.safe_load(client.CoreV1Api(api_client).read_namespaced_config_map("sft-config", namespace)
                            .data["config.yaml"])
    assert config["data"]["dataPath"] == ["/data/alpaca_packed"]
    assert config["checkpoint"]["load"] == "/ckpt/mcore" and config["checkpoint"]["finetune"] is True
    assert pods_of(api_client, namespace, "mg2hf") == []  # the export waits for training
    for i in range(2):
        set_pod_phase(api_client, namespace, f"sft-{i}-0", "Succeeded", exit_code=0)
    wait_for(lambda: len(pods_of(api_client, namespace, "mg2hf")) == 1, what="export pod")
    exported = yaml.safe_load(client.CoreV1Api(api_client).read_namespaced_config_map("mg2hf-config", namespace)
                              .data["config.yaml"])
    assert exported["loadDir"] == "/ckpt/sft" and exported["saveModelType"] == "hf"


def test_a_failed_dependency_fails_the_job(operator, api_client, namespace):
    create(api_client, namespace, _convert("broken", convert={"loadDir": "/models/hf", "saveDir": "/ckpt/x"}),
           "checkpointconverts")
    create(api_client, namespace, job("needs", checkpointConvertRef="broken"))
    wait_for(lambda: len(pods_of(api_client, namespace, "broken")) == 1, what="convert pod")
    set_pod_phase(api_client, namespace, "broken-0-0", "Failed", exit_code=2)
    failed = phase_is(api_client, namespace, "needs", "Failed")
    cond = next(c for c in failed["conditions"] if c["type"] == "Failed")
    assert cond["reason"] == "DependencyFailed" and "CheckpointConvert broken" in cond["message"]


def test_a_reference_cycle_or_an_unusable_dependency_fails_at_once_with_a_warning(operator, api_client, namespace):
    """A cycle would leave every job on it Pending forever; a conversion to HuggingFace can never feed training
    (found as soon as it exists, not after it has run)."""
    create(api_client, namespace, _convert("back", trainJobRef="loop", convert={
        "loadModelType": "mg", "saveModelType": "mg", "saveDir": "/ckpt/back"}), "checkpointconverts")
    create(api_client, namespace, job("loop", checkpointConvertRef="back", train={
        "parallel": {"tensorModelParallelSize": 2}, "checkpoint": {"save": "/ckpt/loop"}}))
    create(api_client, namespace, _convert("to-hf", convert={
        "loadDir": "/mcore", "saveModelType": "hf", "saveDir": "/hf", "modelTypeHf": "qwen3"}), "checkpointconverts")
    create(api_client, namespace, job("wrong-way", checkpointConvertRef="to-hf"))
    for name, plural, reason, says in [
            ("loop", PLURAL, "DependencyCycle", "spec.checkpointConvertRef names CheckpointConvert back, whose "
                                                "spec.trainJobRef names AscendTrainJob loop, this job"),
            ("back", "checkpointconverts", "DependencyCycle", "spec.trainJobRef names AscendTrainJob loop, whose "
                                                              "spec.checkpointConvertRef names CheckpointConvert back"),
            ("wrong-way", PLURAL, "DependencyInvalid", "CheckpointConvert to-hf writes a HuggingFace model")]:
        failed = phase_is(api_client, namespace, name, "Failed", plural)
        cond = next(c for c in failed["conditions"] if c["type"] == "Failed")
        assert cond["reason"] == reason and says in cond["message"], cond
        wait_for(lambda: ("Failed", cond["message"]) in events_of(api_client, namespace, name),
                 what=f"{name}'s Warning event")
    assert pods_of(api_client, namespace, "loop") == [] and pods_of(api_client, namespace, "wrong-way") == []


@pytest.mark.parametrize("spec,message", [
    ({"datasetPrepRef": "p", "train": {"parallel": {"tensorModelParallelSize": 2}, "data": {"dataPath": ["/d"]}}},
     "datasetPrepRef and train.data.dataPath exclude each other"),
    ({"checkpointConvertRef": "c", "train": {"parallel": {"tensorModelParallelSize": 2},
                                             "checkpoint": {"load": "/x"}}},
     "checkpointConvertRef and train.checkpoint.load exclude each other"),
    ({"volcanoQueue": "q"}, "volcanoQueue needs gangScheduling: volcano"),
    ({"runPolicy": {"backoffLimit": -1}}, "spec.runPolicy.backoffLimit"),
    ({"runPolicy": {"cleanPodPolicy": "Some"}}, "spec.runPolicy.cleanPodPolicy"),
])
def test_invalid_specs_are_rejected_with_their_message(api_client, namespace, spec, message):
    from kubernetes.client.rest import ApiException
    with pytest.raises(ApiException) as err:
        create(api_client, namespace, job("bad", **spec))
    assert err.value.status == 422 and message in err.value.body


def test_convert_needs_exactly_one_source(api_client, namespace):
    from kubernetes.client.rest import ApiException
    with pytest.raises(ApiException) as err:
        create(api_client, namespace, _convert("none", convert={"saveDir": "/x"}), "checkpointconverts")
    assert "set exactly one of convert.loadDir and trainJobRef" in err.value.body


def test_a_pod_lost_while_the_gang_restarts_is_replaced_not_waited_for(operator, api_client, namespace):
    """Issue 49's stuck gang: after a gang restart, one of the next attempt's pods is deleted while they are all
    Pending (preemption, node loss, a user). The pass that follows sees the missing index of the current attempt
    and replaces that pod in place (it never ran, so the gang can stay), instead of waiting for ever with N-1 pods."""
    core = client.CoreV1Api(api_client)
    create(api_client, namespace, job("lost", nnodes=3, runPolicy={"backoffLimit": 3},
                                      train={"observability": {"metricsPort": 9400}, "training": {"globalBatchSize": 3}}))
    wait_for(lambda: len(pods_of(api_client, namespace, "lost")) == 3, what="3 pods")
    run_all(api_client, namespace, "lost", n=3)
    phase_is(api_client, namespace, "lost", "Running")
    core.delete_namespaced_pod("lost-1-0", namespace)
    assert phase_is(api_client, namespace, "lost", "Restarting")["restarts"] == 1
    pending = wait_for(lambda: [p for p in pods_of(api_client, namespace, "lost")
                                if p.metadata.labels["ascendtrain.dev/attempt"] == "1"
                                and not p.metadata.deletion_timestamp] or None, what="the next attempt's pods")
    wait_for(lambda: len([p for p in pods_of(api_client, namespace, "lost")
                          if p.metadata.labels["ascendtrain.dev/attempt"] == "1"]) == 3, what="all 3 of attempt 1")
    doomed = next(p for p in pods_of(api_client, namespace, "lost") if p.metadata.name == "lost-2-1")
    assert pending and doomed.status.phase == "Pending"
    core.delete_namespaced_pod("lost-2-1", namespace)
    replaced = wait_for(lambda: next((p for p in pods_of(api_client, namespace, "lost")
                                      if p.metadata.name == "lost-2-1" and p.metadata.uid != doomed.metadata.uid
                                      and not p.metadata.deletion_timestamp), None), what="lost-2-1 replaced")
    assert replaced.metadata.labels["ascendtrain.dev/attempt"] == "1" and replaced.spec.hostname == "lost-2"
    run_all(api_client, namespace, "lost", n=3, attempt=1)
    running = phase_is(api_client, namespace, "lost", "Running")
    assert running["restarts"] == 1  # a pod that never ran cost no restart
    assert any(reason == "PodReplaced" and "lost-2-1" in message
               for reason, message in events_of(api_client, namespace, "lost"))


def test_a_suspended_job_says_which_checkpoint_it_resumes_from(operator, api_client, namespace):
    """Issue 49: a preempted job showed iteration 7 while it had saved 24. Suspending sends SIGTERM; the engine saves
    the step in flight and reports it (its termination message); the pod's finalizer keeps that last status until
    the operator has read it into status.progress and the Suspended condition."""
    custom = client.CustomObjectsApi(api_client)
    create(api_client, namespace, job("ckpt", train={"parallel": {"tensorModelParallelSize": 2},
                                                     "checkpoint": {"save": "/ckpt/ckpt", "saveInterval": 8}}))
    wait_for(lambda: len(pods_of(api_client, namespace, "ckpt")) == 2, what="pods")
    core = client.CoreV1Api(api_client)
    for i in range(2):  # on a node, whose kubelet will report the end (this test's role)
        core.create_namespaced_binding(namespace, {"metadata": {"name": f"ckpt-{i}-0"},
                                                   "target": {"kind": "Node", "name": "node-a"}},
                                       _preload_content=False)
    run_all(api_client, namespace, "ckpt")
    phase_is(api_client, namespace, "ckpt", "Running")
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "ckpt",
                                          {"spec": {"runPolicy": {"suspend": True}}})
    wait_for(lambda: all(p.metadata.deletion_timestamp for p in pods_of(api_client, namespace, "ckpt")),
             what="the pods being deleted, held by the operator's finalizer")
    saved = json.dumps({"status": "Failed", "reason": "Preempted", "iteration": 24,
                        "checkpoint": "/ckpt/ckpt/iter_0000024"})
    for i, message in ((0, saved), (1, None)):  # what each pod's kubelet reports once its container ended
        term = {"exitCode": 143, "reason": "Error", **({"message": message} if message else {})}
        patch_pod_status(api_client, namespace, f"ckpt-{i}-0", {"phase": "Failed", "containerStatuses": [{
            "name": "engine", "ready": False, "restartCount": 0, "image": "x", "imageID": "",
            "state": {"terminated": term}}]})
    suspended = wait_for(lambda: (s := get_job(api_client, namespace, "ckpt")["status"]).get("progress", {}).get(
        "lastCheckpointIteration") == 24 and s, what="the saved checkpoint in the status")
    condition = next(c for c in suspended["conditions"] if c["type"] == "Suspended")
    assert suspended["phase"] == "Suspended" and "resumes from the checkpoint of iteration 24" in condition["message"]
    for i in range(2):  # the kubelet's final delete, once their end is posted
        core.delete_namespaced_pod(f"ckpt-{i}-0", namespace, grace_period_seconds=0)
    wait_for(lambda: pods_of(api_client, namespace, "ckpt") == [], what="the stopped pods released and gone")
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "ckpt",
                                          {"spec": {"runPolicy": {"suspend": False}}})
    wait_for(lambda: len(pods_of(api_client, namespace, "ckpt")) == 2, what="pods again")
    assert get_job(api_client, namespace, "ckpt")["status"].get("restarts", 0) == 0


def test_pods_a_suspension_deletes_are_released_without_waiting_for_the_sweep(kubeconfig, api_client, namespace,
                                                                             tmp_path):
    """Found by the fault sequences: a suspension deleted the pending pods, whose deletion the pod cache already
    held (the operator's own write, stamped with its own clock: when the server's stamp fell in the same second,
    the watch event changed nothing the cache reads and brought no further pass), so they stayed terminating on the
    operator's finalizer until the periodic sweep. With the sweep off, they must still go."""
    import subprocess
    from test_operator_train_job import operator_command, operator_env
    env = operator_env(kubeconfig, ASCEND_OPERATOR_PROGRESS_INTERVAL="3600")
    with open(tmp_path / "operator.log", "w") as log:
        proc = subprocess.Popen(operator_command(namespace, "--standalone"), env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            create(api_client, namespace, job("quick"))
            wait_for(lambda: len(pods_of(api_client, namespace, "quick")) == 2, what="pods")
            client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, "quick", {"spec": {"runPolicy": {"suspend": True}}})
            phase_is(api_client, namespace, "quick", "Suspended")
            wait_for(lambda: pods_of(api_client, namespace, "quick") == [], timeout=20,
                     what="the pending pods released and gone with no sweep")
        finally:
            proc.terminate()
            proc.wait(15)
