"""Gang scheduling by kube-scheduler and placement by topology, without a cluster: what the operator renders
(kube-scheduler's PodGroup per attempt, Kueue's topology request and gate), the NODE_RANK order it derives from
where the pods landed, the launcher's wait for its rank, and the local cluster's node labels. The schedulers
themselves are exercised in tests/operator/test_operator_kueue.py."""
import os
import threading
import time

import pytest

from ascend_cluster import topology as local_topology
from ascend_engine import node_rank
from ascend_engine.stacks import ANNOTATIONS_FILE_ENV
from ascend_engine.telemetry import started_up
from ascend_operator.api.topology import BLOCK, HOST, RACK
from ascend_operator.api.train_job import AscendTrainJobSpec
from ascend_operator.cache.job_pods import JobPods, slim
from ascend_operator.kueue import integration as kueue
from ascend_operator.kueue import topology as tas
from ascend_operator.lifecycle import attempts
from ascend_operator.render import gang
from ascend_operator.render import train_job as render
from ascend_operator.topology import order, placement

LABELS = {"node-1": {BLOCK: "block-0", RACK: "rack-0"}, "node-2": {BLOCK: "block-0", RACK: "rack-0"},
          "node-3": {BLOCK: "block-0", RACK: "rack-1"}, "node-4": {BLOCK: "block-0", RACK: "rack-1"}}
LEVELS = [BLOCK, RACK, HOST]


def _spec(**overrides):
    base = {"image": "engine:1", "nnodes": 4, "nprocPerNode": 1,
            "train": {"parallel": {"tensorModelParallelSize": 2, "pipelineModelParallelSize": 2},
                      "training": {"globalBatchSize": 4}}}
    base.update(overrides)
    return AscendTrainJobSpec.model_validate(base)


# -- the order --------------------------------------------------------------------------------------------------

def test_ranks_follow_the_domains_and_pod_0_keeps_rank_0():
    # pods 0 and 2 on node-3, 1 and 3 on node-1: each node's pods take consecutive ranks, pod 0's domain first
    assert order.rank_order({0: "node-3", 1: "node-1", 2: "node-3", 3: "node-1"}, LABELS, LEVELS) == [0, 2, 1, 3]
    # one pod a node: racks first (pods 0 and 3 share rack-1), then nodes
    assert order.rank_order({0: "node-4", 1: "node-1", 2: "node-2", 3: "node-3"}, LABELS, LEVELS) == [0, 3, 1, 2]
    # a placement that keeps consecutive indices together (Kueue's assignment by pod index) keeps them
    assert order.rank_order({0: "node-2", 1: "node-2", 2: "node-4", 3: "node-4"}, LABELS, LEVELS) == [0, 1, 2, 3]
    # a node without the labels is a domain of its own
    assert order.rank_order({0: "x", 1: "node-1", 2: "x"}, LABELS, LEVELS) == [0, 2, 1]


def test_the_order_reads_compactly_and_back():
    for ranked in ([0, 1, 2, 3], [0, 2, 1, 3], [0, 1, 2, 5, 4, 3], list(range(4096))):
        assert order.parse_ranges(order.ranges(ranked)) == ranked
    assert order.ranges([0, 1, 2, 5, 4, 3]) == "0-2,5,4,3"
    assert order.ranges(list(range(4096))) == "0-4095"


def test_tensor_parallel_groups_split_across_hosts_are_counted():
    nodes = {0: "node-1", 1: "node-2", 2: "node-1", 3: "node-2"}
    assert order.split_groups([0, 1, 2, 3], nodes, LABELS, HOST, 2) == (2, 2)
    assert order.split_groups(order.rank_order(nodes, LABELS, LEVELS), nodes, LABELS, HOST, 2) == (2, 0)
    assert order.domains(nodes, LABELS, LEVELS) == {BLOCK: 1, RACK: 1, HOST: 2}


def _pod(index, node=None, attempt=0, rank=None):
    pod = {"metadata": {"name": f"j-{index}-{attempt}", "uid": f"u{index}", "resourceVersion": "1",
                        "labels": {"ascendtrain.dev/job-name": "j", "ascendtrain.dev/job-kind": "AscendTrainJob",
                                   "ascendtrain.dev/replica-index": str(index), "ascendtrain.dev/attempt": str(attempt)},
                        "annotations": {node_rank.NODE_RANK_ANNOTATION: str(rank)} if rank is not None else {}},
           "spec": {"nodeName": node} if node else {}, "status": {"phase": "Pending"}}
    return slim(pod)


def test_the_order_is_decided_once_every_pod_is_bound(monkeypatch):
    monkeypatch.setattr(placement, "_node_labels", lambda names: {n: LABELS[n] for n in names})
    rank_order = render.rank_order(_spec(topology={"required": RACK, "tensorParallel": HOST}))
    assert rank_order == (LEVELS, HOST, 2)
    partly = JobPods([_pod(0, "node-3"), _pod(1, "node-1"), _pod(2), _pod(3, "node-1")])
    assert "placement" not in placement.decide(rank_order, partly, 4, 0, {})
    bound = JobPods([_pod(0, "node-3"), _pod(1, "node-1"), _pod(2, "node-3"), _pod(3, "node-1")])
    status = placement.decide(rank_order, bound, 4, 0, {})
    assert {k: v for k, v in status["placement"].items() if k != "time"} == {
        "attempt": 0, "podsByRank": "0,2,1,3", "domains": {BLOCK: 1, RACK: 2, HOST: 2},
        "tensorParallelGroups": 2, "tensorParallelGroupsSplit": 0}
    assert placement.decide(rank_order, bound, 4, 0, status) is status  # decided once an attempt
    assert placement.ranks(status, 0) == {0: 0, 2: 1, 1: 2, 3: 3} and placement.ranks(status, 1) is None
    todo = placement.to_annotate(status, bound, 0)
    assert sorted((p["metadata"]["name"], r) for p, r in todo) == [("j-0-0", 0), ("j-1-0", 2), ("j-2-0", 1),
                                                                    ("j-3-0", 3)]
    annotated = JobPods([_pod(0, "node-3", rank=0), _pod(1, "node-1", rank=2), _pod(2, "node-3", rank=1),
                         _pod(3, "node-1")])
    assert [(p["metadata"]["name"], r) for p, r in placement.to_annotate(status, annotated, 0)] == [("j-3-0", 3)]
    # without spec.topology, or with a trainer command, pod i stays NODE_RANK i
    assert render.rank_order(_spec()) is None
    assert render.rank_order(_spec(train=None, trainer={"command": ["t"]}, topology={"required": RACK})) is None
    assert "placement" not in placement.decide(None, bound, 4, 0, {})


# -- what is rendered -------------------------------------------------------------------------------------------

def test_kubernetes_gang_is_a_pod_group_per_attempt():
    spec = _spec(gangScheduling="kubernetes", topology={"required": RACK})
    objects = render.objects("j", "ns", spec)
    attempts.stamp(objects, "j", 2)
    gang.stamp(objects, "j", 2)
    [group] = [o for o in objects if o["kind"] == "PodGroup"]
    assert gang.per_attempt(group) and group["metadata"]["name"] == "j-2"
    assert group["spec"] == {"schedulingPolicy": {"gang": {"minCount": 4}},
                             "schedulingConstraints": {"topology": [{"key": RACK}]}}
    pods = [o for o in objects if o["kind"] == "Pod"]
    assert {p["spec"]["schedulingGroup"]["podGroupName"] for p in pods} == {"j-2"}
    assert "schedulerName" not in pods[0]["spec"]  # kube-scheduler's own (default) profile
    volcano = [o for o in render.objects("j", "ns", _spec(gangScheduling="volcano")) if o["kind"] == "PodGroup"]
    assert not gang.per_attempt(volcano[0])


def test_pods_after_0_wait_for_their_rank_and_pod_0_keeps_rank_0():
    spec = _spec(topology={"tensorParallel": HOST}, masterWaitSeconds=90)
    env = lambda i: {e["name"]: e for e in render.pod("j", "ns", spec, i)["spec"]["containers"][0]["env"]}  # noqa
    assert env(0)["NODE_RANK"]["value"] == "0" and node_rank.WAIT_ENV not in env(0)
    worker = env(3)
    field = {"fieldRef": {"fieldPath": f"metadata.annotations['{node_rank.NODE_RANK_ANNOTATION}']"}}
    assert worker["NODE_RANK"]["valueFrom"] == field and worker["PET_NODE_RANK"]["valueFrom"] == field
    assert worker[node_rank.WAIT_ENV]["value"] == node_rank.NODE_RANK_ANNOTATION
    assert worker[node_rank.TIMEOUT_ENV]["value"] == "90"
    assert worker[node_rank.POD_INDEX_ENV]["value"] == "3" and node_rank.POD_INDEX_ENV not in env(0)
    assert ANNOTATIONS_FILE_ENV in worker  # the downwardAPI file the rank arrives through
    assert render.pod("j", "ns", _spec(), 3)["spec"]["containers"][0]["env"][3] == {"name": "NODE_RANK",
                                                                                       "value": "3"}


def test_kueue_pod_set_carries_the_topology_request():
    spec = _spec(topology={"required": BLOCK, "tensorParallel": HOST})
    objects = render.objects("j", "ns", spec)
    [pod_set], _ = kueue._pod_sets(objects)
    assert pod_set["template"]["metadata"]["annotations"] == {tas.REQUIRED: BLOCK, tas.SLICE_REQUIRED: HOST,
                                                              tas.SLICE_SIZE: "2"}
    assert pod_set["topologyRequest"] == {"required": BLOCK, "podIndexLabel": "ascendtrain.dev/replica-index",
                                          "podSetSliceRequiredTopology": HOST, "podSetSliceSize": 2}
    # neither required nor preferred: Kueue takes pods for TAS only with one, so the coarsest level is preferred
    assert tas.annotations(_spec(topology={"levels": [RACK, HOST]})) == {tas.PREFERRED: RACK}
    # a tensor-parallel group inside one pod needs no slices
    assert tas.annotations(_spec(nprocPerNode=2, nnodes=2, topology={"tensorParallel": HOST})) == \
        {tas.PREFERRED: BLOCK}
    assert "topologyRequest" not in kueue._pod_sets(render.objects("j", "ns", _spec()))[0][0]


def test_children_lose_kueues_topology_annotations_unless_admitted_by_topology():
    objects = render.objects("j", "ns", _spec(topology={"required": BLOCK}))
    kueue.keep_off_children(objects)
    pod = next(o for o in objects if o["kind"] == "Pod")
    assert not any(k.startswith("kueue.x-k8s.io/") for k in pod["metadata"].get("annotations") or {})
    tas.gate(pod, "wl", {tas.REQUIRED: BLOCK})
    assert pod["metadata"]["annotations"] == {tas.REQUIRED: BLOCK, tas.WORKLOAD_ANNOTATION: "wl"}
    assert pod["spec"]["schedulingGates"] == [{"name": tas.GATE}]


@pytest.mark.parametrize("topology,message", [
    ({"required": RACK, "preferred": BLOCK}, "exclude each other"),
    ({"required": "example.com/zone"}, "must be one of topology.levels"),
    ({"levels": [HOST, HOST]}, "must not repeat"),
])
def test_refused_topologies(topology, message):
    with pytest.raises(ValueError, match=message):
        _spec(topology=topology)


def test_tensor_parallel_topology_needs_whole_pods_per_group():
    with pytest.raises(ValueError, match="multiple of nprocPerNode"):
        _spec(nnodes=4, nprocPerNode=3, train={"parallel": {"tensorModelParallelSize": 4},
                                                "training": {"globalBatchSize": 3}},
              topology={"tensorParallel": HOST})
    assert _spec(topology={"tensorParallel": HOST}).tensor_parallel_pods() == 2


# -- the launcher's side ----------------------------------------------------------------------------------------

def test_the_launcher_waits_for_its_rank_from_the_annotations_file(tmp_path, monkeypatch, capsys):
    annotations = tmp_path / "annotations"
    annotations.write_text('other="x"\n')
    monkeypatch.setenv(ANNOTATIONS_FILE_ENV, str(annotations))
    monkeypatch.setenv(node_rank.WAIT_ENV, node_rank.NODE_RANK_ANNOTATION)
    monkeypatch.setenv("NODE_RANK", "")  # the kubelet's value of the fieldRef before the annotation exists
    monkeypatch.delenv("PET_NODE_RANK", raising=False)
    later = threading.Timer(0.3, lambda: annotations.write_text(
        f'{node_rank.NODE_RANK_ANNOTATION}="2"\nother="x"\n'))
    later.start()
    argv = ["--nnodes=4", "--node-rank=", "--master-addr=m", "-m", "ascend_engine"]
    assert node_rank.resolve(argv, time.perf_counter()) == ["--nnodes=4", "--node-rank=2", "--master-addr=m", "-m",
                                                            "ascend_engine"]
    assert os.environ["NODE_RANK"] == os.environ["PET_NODE_RANK"] == "2"
    capsys.readouterr()
    # written before the pod started: the kubelet expanded it, the launcher only says which rank it got
    assert node_rank.resolve(["--node-rank=2"], time.perf_counter()) == ["--node-rank=2"]
    assert "NODE_RANK 2 (ordered by topology)" in "".join(capsys.readouterr())
    monkeypatch.setenv("NODE_RANK", "")
    monkeypatch.setenv(node_rank.TIMEOUT_ENV, "0.2")
    annotations.write_text('other="x"\n')
    with pytest.raises(node_rank.NodeRankTimeout, match="no NODE_RANK after"):
        node_rank.resolve(argv, time.perf_counter())
    started_up()  # no more start-up lines from this process


# -- the local cluster's labels ----------------------------------------------------------------------------------

def test_local_nodes_fill_racks_and_blocks_in_order():
    assert local_topology.parse("blocks=1,racks=2") == (1, 2) and local_topology.parse("racks=3") == (1, 3)
    labels = local_topology.node_labels([f"node-{i}" for i in range(1, 5)], 1, 2)
    assert labels == LABELS
    assert {v[RACK] for v in local_topology.node_labels([f"n{i}" for i in range(8)], 2, 2).values()} == \
        {"rack-0", "rack-1", "rack-2", "rack-3"}
    with pytest.raises(ValueError):
        local_topology.parse("racks=0")
    with pytest.raises(ValueError):
        local_topology.node_labels(["a"], 1, 2)
