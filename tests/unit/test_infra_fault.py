"""Node and device faults: which failures they are, the restart that avoids the node without spending
backoffLimit, and the affinity that keeps the new pods off it while keeping the user's own."""
import pytest

from ascend_operator.api.group import POD_FINALIZER
from ascend_operator.api.run_policy import RunPolicy
from ascend_operator.faults.infra_fault import avoid_nodes, device_fault, fault
from ascend_operator.cache.job_pods import slim
from ascend_operator.lifecycle.status import derive


def pod(index, phase, node="node-1", message=None, exit_code=1, conditions=(), deleting=False):
    status = {"phase": phase, "conditions": list(conditions)}
    if phase == "Failed":
        status["containerStatuses"] = [{"state": {"terminated": {
            "exitCode": exit_code, "reason": "Error", **({"message": message} if message else {})}}}]
    meta = {"name": f"j-{index}", "uid": f"u{index}", "labels": {"ascendtrain.dev/replica-index": str(index)}}
    if deleting:  # the operator's pods carry its finalizer: a deleted one stays, with its last status, until counted
        meta.update(deletionTimestamp="2026-01-01T00:00:00Z", finalizers=[POD_FINALIZER])
    return slim({"metadata": meta, "spec": {"nodeName": node}, "status": status})


@pytest.mark.parametrize("line", [
    "RuntimeError: ACL stream synchronize failed, error code:507018. [ERROR] device error",
    "EZ9999: Inner Error! The error from device(chipId:0, dieId:0), serial number is 3, an exception occurred",
    "EI0002: The wait execution of the Notify register times out. HCCL timeout on ring 0",
    "RuntimeError: HCCL function error: HcclAllReduce, error code is 7",
    "RuntimeError: CUDA error: uncorrectable ECC error encountered",
    "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error",
])
def test_device_errors_are_recognised(line):
    assert device_fault(f"Traceback (most recent call last):\n  ...\n{line}\n") == line


@pytest.mark.parametrize("message", [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "ValueError: config.json missing in /models/x",
    '{"status": "Failed", "message": "dataset /data/x.bin not found"}',
])
def test_program_errors_are_not_device_faults(message):
    assert device_fault(message) is None


def test_device_fault_restarts_avoiding_the_node_without_spending_backoff_limit():
    broken = pod(1, "Failed", node="node-2", message="EZ9999: Inner Error! device error on chip 3")
    peer = pod(0, "Failed", node="node-1", message="RuntimeError: Connection reset by peer")  # a consequence
    status = derive([peer, broken], 2, {"phase": "Running", "restarts": 1}, RunPolicy(backoffLimit=1))
    assert status["phase"] == "Restarting" and status["restarts"] == 2 and status["disruptions"] == 1
    assert [(a["node"], a["reason"]) for a in status["avoidedNodes"]] == [("node-2", "DeviceFault")]
    restarting = next(c for c in status["conditions"] if c["type"] == "Restarting")
    assert restarting["reason"] == "DeviceFault" and "not counted against runPolicy.backoffLimit" in \
        restarting["message"] and "new pods avoid node(s) node-2" in restarting["message"]
    # A program's own failure still counts (and here exhausts the limit).
    plain = pod(1, "Failed", exit_code=137)
    assert derive([plain], 1, {"phase": "Running", "restarts": 1}, RunPolicy(backoffLimit=1))["phase"] == "Failed"


def test_a_pod_evicted_from_a_lost_node_avoids_it_and_nodes_accumulate():
    evicted = pod(1, "Running", node="node-3", deleting=True, conditions=[{
        "type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
        "message": "Taint manager: deleting due to NoExecute taint"}])
    assert fault(evicted) == ("NodeFault", "DeletionByTaintManager: Taint manager: deleting due to NoExecute taint")
    before = {"phase": "Running", "conditions": [{"type": "Created", "status": "True", "reason": "Created",
                                                  "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
              "avoidedNodes": [{"node": "node-2", "reason": "DeviceFault", "message": "m", "time": "t"}]}
    status = derive([pod(0, "Running"), evicted], 2, before, RunPolicy(backoffLimit=0))
    assert status["phase"] == "Restarting" and status["disruptions"] == 1
    assert [a["node"] for a in status["avoidedNodes"]] == ["node-2", "node-3"]
    gc = pod(0, "Failed", node="node-4", exit_code=None, conditions=[{
        "type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC", "message": "PodGC: node no longer "
                                                                                          "exists"}])
    assert fault(gc)[0] == "NodeFault"
    preempted = pod(0, "Failed", conditions=[{"type": "DisruptionTarget", "status": "True",
                                              "reason": "PreemptionByScheduler"}])
    assert fault(preempted) is None  # a disruption, but the node is fine


def test_avoidance_is_added_to_every_term_of_the_users_affinity():
    user = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "accelerator", "operator": "In", "values": ["910b"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["spare"]}]}]}},
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "zone"}]}}
    objects = [{"kind": "ConfigMap"}, {"kind": "Pod", "spec": {"affinity": user}}, {"kind": "Pod", "spec": {}}]
    avoid_nodes(objects, ["node-3", "node-2", "node-3"])
    rule = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-2", "node-3"]}
    terms = objects[1]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert terms[0]["matchExpressions"] == [{"key": "accelerator", "operator": "In", "values": ["910b"]}, rule]
    assert terms[1]["matchExpressions"] == [rule] and terms[1]["matchFields"][0]["values"] == ["spare"]
    assert objects[1]["spec"]["affinity"]["podAntiAffinity"] == user["podAntiAffinity"]
    assert len(user["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchExpressions"]) == 1  # the spec's own dict is untouched
    assert objects[2]["spec"]["affinity"] == {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [rule]}]}}}


def test_a_node_lost_under_the_new_gang_restarts_it_again_or_replaces_a_pod_that_never_ran():
    """The new gang's pods are all that ``derive`` reads (the old gang's evictions belong to an older attempt). A pod
    of it evicted after it ran restarts the gang again; one evicted before it ran is replaced under its own name:
    both keep the new pods off the lost node."""
    evicted = {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}
    restarting = {"phase": "Restarting", "restarts": 1, "disruptions": 1,
                  "conditions": [{"type": "Restarting", "status": "True", "reason": "NodeFault", "message": "m"}],
                  "avoidedNodes": [{"node": "node-1", "reason": "NodeFault", "message": "m", "time": "t"}]}
    ran = pod(1, "Running", node="node-3", deleting=True, conditions=[evicted])
    again = derive([pod(0, "Pending", node="node-2"), ran], 2, restarting)
    assert again["restarts"] == 2 and [a["node"] for a in again["avoidedNodes"]] == ["node-1", "node-3"]
    never_ran = pod(1, "Pending", node="node-3", deleting=True, conditions=[evicted])
    kept = derive([pod(0, "Pending", node="node-2"), never_ran], 2, restarting)
    assert (kept["phase"], kept["restarts"]) == ("Restarting", 1)
    assert [a["node"] for a in kept["avoidedNodes"]] == ["node-1", "node-3"]