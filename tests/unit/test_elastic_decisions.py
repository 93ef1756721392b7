"""When an elastic job resizes, and to what: decided from plain Node and Pod dicts as kube-apiserver serves them
(node.status.allocatable, taints, spec.unschedulable, Ready; pods' spec.nodeName and requests; PodScheduled False
with reason Unschedulable)."""
from __future__ import annotations

import datetime as dt

import pytest

from ascend_operator.recovery import elastic
from ascend_operator.api.train_job import AscendTrainJobSpec
from ascend_operator.recovery.capacity import pods_that_fit
from ascend_operator.cache.job_pods import JobPods, slim
from ascend_operator.render import train_job as render
from ascend_operator.lifecycle.status import derive

DEVICE = "huawei.com/Ascend910"
AT = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)


def _stamp(seconds_ago: float) -> str:
    return (AT - dt.timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _spec(nnodes=4, min_nodes=1, gbs=8, timeout=60) -> AscendTrainJobSpec:
    return AscendTrainJobSpec.model_validate({
        "image": "x", "nnodes": nnodes, "nprocPerNode": 2, "devices": {"resource": DEVICE},
        "elastic": {"minNodes": min_nodes, "scaleInTimeoutSeconds": timeout},
        "train": {"model": {"numLayers": 2}, "training": {"globalBatchSize": gbs}, "checkpoint": {"save": "/c"}}})


def _node(name, devices=2, ready=True, **spec):
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}, "spec": spec,
            "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110", DEVICE: str(devices)},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def _pod(name, node=None, devices=2, phase="Running", job="other", namespace="default"):
    return {"metadata": {"name": name, "namespace": namespace, "labels": {"ascendtrain.dev/job-name": job}},
            "spec": {"nodeName": node, "containers": [{"resources": {"limits": {DEVICE: str(devices)}}}]},
            "status": {"phase": phase}}


def _mine(pod):
    return pod["metadata"]["labels"].get("ascendtrain.dev/job-name") == "j"


SHAPE = render.pod("j", "default", _spec(), 0)  # 2 devices a pod


def test_capacity_counts_allocatable_minus_bound_requests_and_skips_unusable_nodes():
    nodes = [_node("a", 4), _node("b", 2), _node("cordoned", 8, unschedulable=True), _node("down", 8, ready=False),
             _node("tainted", 8, taints=[{"key": "maint", "effect": "NoSchedule"}]),
             _node("soft", 2, taints=[{"key": "x", "effect": "PreferNoSchedule"}])]
    pods = [_pod("o1", "a", 2), _pod("done", "b", 2, phase="Succeeded"), _pod("mine", "b", 2, job="j"),
            _pod("pending", None, 2)]
    # a: 4 - 2 = 2 devices (1 pod); b: 2 (the finished pod and the job's own do not count); soft: 1.
    assert pods_that_fit(nodes, pods, SHAPE, _mine) == 3
    tolerant = {**SHAPE, "spec": {**SHAPE["spec"], "tolerations": [{"key": "maint", "operator": "Exists"}]}}
    assert pods_that_fit(nodes, pods, tolerant, _mine) == 7
    selective = {**SHAPE, "spec": {**SHAPE["spec"], "nodeSelector": {"kubernetes.io/hostname": "a"}}}
    assert pods_that_fit(nodes, pods, selective, _mine) == 1
    # A node the job avoids after a fault (required node affinity, hostname NotIn) holds none of its pods.
    avoiding = {**SHAPE, "spec": {**SHAPE["spec"], "affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["a"]}]}]}}}}}
    assert pods_that_fit(nodes, pods, avoiding, _mine) == 2


def _status(current, phase="Restarting", checkpoint=None, **elastic_extra):
    status = {"phase": phase, "conditions": [], "restarts": 1,
              "elastic": {"desiredNodes": 4, "currentNodes": current, "nodes": f"{current}/4", **elastic_extra}}
    if checkpoint is not None:
        status["progress"] = {"lastCheckpointIteration": checkpoint}
    return status


def _job_pods(n_running, n_unschedulable, since):
    pods = [_pod(f"j-{i}", f"n{i}", job="j") for i in range(n_running)]
    for i in range(n_running, n_running + n_unschedulable):
        pod = _pod(f"j-{i}", None, job="j", phase="Pending")
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                        "message": "0/3 nodes are available", "lastTransitionTime": since}]
        pods.append(pod)
    for i, p in enumerate(pods):
        p["metadata"]["labels"]["ascendtrain.dev/replica-index"] = str(i)
    return JobPods(slim(p) for p in pods)  # what the pod cache keeps must carry the condition's time


def test_unschedulable_past_the_timeout_scales_in_to_the_largest_size_that_fits():
    spec = _spec(nnodes=4, gbs=8)  # sizes 4, 2, 1 (3 pods x 2 = dp 6 does not divide 8)
    pods = _job_pods(2, 2, _stamp(30))
    assert elastic.resize(spec, _status(4), pods, lambda: 3, AT) is None  # not yet: 30 s < 60 s
    pods = _job_pods(2, 2, _stamp(61))
    status, reason, message = elastic.resize(spec, _status(4), pods, lambda: 3, AT)
    assert reason == "ScaledIn" and status["elastic"]["currentNodes"] == 2 and status["elastic"]["resizes"] == 1
    assert status["phase"] == "Restarting" and status["restarts"] == 1  # not a counted restart
    assert "4 -> 2 pods" in message and "holds 3 of this job's pods" in message
    resized = next(c for c in status["conditions"] if c["type"] == "Resized")
    assert resized["reason"] == "ScaledIn" and resized["status"] == "True"
    # The count says 4 fit yet the scheduler disagrees: one size down. Nothing fits: the smallest size.
    assert elastic.resize(spec, _status(4), pods, lambda: 4, AT)[0]["elastic"]["currentNodes"] == 2
    assert elastic.resize(spec, _status(4), pods, lambda: 0, AT)[0]["elastic"]["currentNodes"] == 1
    # At elastic.minNodes there is nowhere to go: the pods wait.
    assert elastic.resize(spec, _status(1), _job_pods(0, 1, _stamp(600)), lambda: 0, AT) is None


def test_capacity_back_scales_out_at_the_next_checkpoint_only():
    spec = _spec(nnodes=4, gbs=8)
    running = _job_pods(1, 0, "")
    assert elastic.resize(spec, _status(1, "Running", 6), running, lambda: 1, AT) is None  # nothing came back
    noted, reason, _ = elastic.resize(spec, _status(1, "Running", 6), running, lambda: 3, AT)
    assert reason == "" and noted["elastic"]["scaleOutAfterCheckpoint"] == 6
    assert elastic.resize(spec, noted, running, lambda: 3, AT) is None  # no newer checkpoint yet
    later = {**noted, "progress": {"lastCheckpointIteration": 8}}
    status, reason, message = elastic.resize(spec, later, running, lambda: 3, AT)
    assert reason == "ScaledOut" and status["elastic"]["currentNodes"] == 2 and "checkpoint at iteration 8" in message
    assert status["elastic"]["scaleOutAfterCheckpoint"] is None  # null: the merge patch removes it
    gone, reason, _ = elastic.resize(spec, noted, running, lambda: 1, AT)  # the capacity went away again
    assert reason == "" and gone["elastic"]["scaleOutAfterCheckpoint"] is None


def test_prepare_renders_the_pods_at_the_current_size_and_derive_keeps_the_block():
    spec = _spec(nnodes=4)
    sized, extra = elastic.prepare(spec, _status(2))
    assert sized.nnodes == 2 and spec.nnodes == 4
    assert extra["elastic"] == {"desiredNodes": 4, "currentNodes": 2, "nodes": "2/4"}
    env = {e["name"]: e.get("value") for e in render.pod("j", "default", sized, 1)["spec"]["containers"][0]["env"]}
    assert env["NNODES"] == "2" and env["WORLD_SIZE"] == "4" and env["PET_NNODES"] == "2"
    assert [o["metadata"]["name"] for o in render.objects("j", "default", sized) if o["kind"] == "Pod"] == ["j-0", "j-1"]
    assert derive(_job_pods(2, 0, ""), 2, {**_status(2), **extra})["elastic"]["nodes"] == "2/4"


@pytest.mark.parametrize("phase", ["Succeeded", "Failed", "Suspended"])
def test_finished_or_suspended_jobs_never_resize(phase):
    assert elastic.resize(_spec(), _status(2, phase, 9), _job_pods(0, 4, _stamp(600)), lambda: 8, AT) is None
