"""Kueue and kube-scheduler for real: Kueue's own manager (built from its module, ``ascend_cluster.kueue``) admits
AscendTrainJobs through the Workloads the operator makes for them, as the controller of an external framework does;
kube-scheduler's own gang scheduling (``gangScheduling: kubernetes``) and Kueue's topology-aware scheduling place
them.

One local cluster for the module (control plane, the operator, Kueue, 4 nodes of 2 devices each, labelled one block
of two racks: node-1 and node-2 in rack-0, node-3 and node-4 in rack-1); each test has a namespace of its own.

* Two jobs queued (a ClusterQueue with quota for one job, 500m CPU): the first is admitted and runs with its
  flavor's node selector; the second waits (its Workload pending, the job suspended, no pods) and runs once the
  first has finished and given its quota back.
* Preemption: a higher-priority job (WorkloadPriorityClass) evicts a running one; its pods stop (the engine saves
  a checkpoint on SIGTERM), its quota goes to the preemptor, and once readmitted it resumes from its checkpoint
  (rank 0 loads an iteration > 0) and finishes at its last iteration.
* All or nothing, kube-scheduler alone: two 3-pod gangs whose pods each take a whole node, applied together on the
  4 nodes: one runs, the other has no pod bound until the first ends; a node lost under the running gang restarts
  it, and on the 3 nodes left one gang is bound whole and the other not at all.
* Ranks by topology: a TP2 x PP2 job of 4 one-device pods, once held to one rack by kube-scheduler's PodGroup
  topology constraint (NODE_RANK reordered so each tensor-parallel pair shares a node), once placed by Kueue's
  topology-aware scheduling (pod set slices of 2 pods per host); the two runs' losses are equal, whatever the order.

Without Kueue (the session's control plane), a queued job stays suspended and a Warning event says why.
"""
from __future__ import annotations

import re
import time

import pytest
from kubernetes import client

from ascend_cluster import topology
from ascend_cluster.cluster import LocalCluster
from ascend_cluster.resource_client import ResourceClient
from e2e.workspace import create_workspace, quickstart_job
from test_operator_train_job import create, get_job, job, operator, pods_of, wait_for  # noqa: F401

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
ATJ = "/apis/ascendtrain.dev/v1alpha1"
DEVICE = "huawei.com/Ascend910"
NODE_LABEL = {topology.BLOCK: "block-0"}  # every node's; the flavor's nodeLabels
ITERS = 150  # the preempted job's: far from done (~0.1 s an iteration) when the preemptor comes at iteration 5+


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(root=tmp_path_factory.mktemp("kueue") / "cluster", operator=True, kueue=True,
                      fast_storage=True, nodes=4, capacity={DEVICE: 2}, topology=(1, 2), node_grace_s=6.0) as local:
        yield local


@pytest.fixture
def resources(cluster):
    with cluster.client() as client:
        yield client


def _kueue(kind: str, name: str, spec: dict | None = None, **fields) -> dict:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": kind, "metadata": {"name": name},
            **({"spec": spec} if spec is not None else {}), **fields}


def _queues(resources: ResourceClient, cluster: LocalCluster, namespace: str, preemption: bool = False) -> None:
    """Namespace, workspace claim, a ResourceFlavor, a ClusterQueue with 500m CPU and a LocalQueue ``jobs``."""
    resources.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    create_workspace(cluster, namespace)
    resources.apply(_kueue("ResourceFlavor", f"{namespace}-cpu", {"nodeLabels": NODE_LABEL}))
    spec = {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
        {"name": f"{namespace}-cpu", "resources": [{"name": "cpu", "nominalQuota": "500m"}]}]}]}
    if preemption:
        spec["preemption"] = {"withinClusterQueue": "LowerPriority"}
    resources.apply(_kueue("ClusterQueue", namespace, spec))
    queue = _kueue("LocalQueue", "jobs", {"clusterQueue": namespace})
    queue["metadata"]["namespace"] = namespace
    resources.apply(queue, namespace)


def _job(namespace: str, name: str, iters: int, **labels: str) -> dict:
    """The quickstart's model on one pod (500m CPU: the ClusterQueue's whole quota), queued in ``jobs``."""
    job = quickstart_job()
    job["metadata"].update(name=name, namespace=namespace,
                           labels={"kueue.x-k8s.io/queue-name": "jobs", **labels})
    job["spec"]["nnodes"] = 1
    train = job["spec"]["train"]
    train["parallel"]["tensorModelParallelSize"] = 1
    train["training"]["trainIters"] = iters
    train["checkpoint"].update(save=f"/workspace/checkpoints/{name}", saveInterval=5)
    return job


def _get(resources, namespace, name):
    return resources.request("GET", f"{ATJ}/namespaces/{namespace}/ascendtrainjobs/{name}")


def _workload(resources, namespace, job):
    """The Workload the operator made for ``job`` (its only one), or None."""
    found = [w for w in resources.request("GET", f"{KUEUE}/namespaces/{namespace}/workloads")["items"]
             if any(r["name"] == job for r in w["metadata"].get("ownerReferences") or [])]
    assert len(found) <= 1, found
    return found[0] if found else None


def _true(obj, type_):
    return any(c["type"] == type_ and c["status"] == "True" for c in (obj.get("status") or {}).get("conditions") or [])


def _pods(resources, namespace, job):
    return resources.request("GET", f"/api/v1/namespaces/{namespace}/pods",
                             query={"labelSelector": f"ascendtrain.dev/job-name={job}"})["items"]


def _wait(what, until, seconds=300):
    deadline = time.monotonic() + seconds
    while not (found := until()):
        assert time.monotonic() < deadline, what
        time.sleep(0.5)
    return found


def _phase(resources, namespace, name, *phases):
    return _wait(f"{name} not {phases}", lambda: (_get(resources, namespace, name).get("status") or {})
                 .get("phase") in phases and _get(resources, namespace, name)["status"])


def _events(resources, namespace, name):
    """The job's events as (reason, count), oldest first (a repeated event is one Event with a count)."""
    items = resources.request("GET", f"/api/v1/namespaces/{namespace}/events")["items"]
    items.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [(e["reason"], e.get("count") or 1) for e in items if e["involvedObject"]["name"] == name]


@pytest.mark.e2e
def test_second_job_waits_for_the_quota_of_the_first(cluster, resources):
    ns = "kueue-fifo"
    _queues(resources, cluster, ns)
    resources.apply(_job(ns, "first", 10), ns)
    admitted = _wait("first not admitted", lambda: (w := _workload(resources, ns, "first")) and _true(w, "Admitted")
                     and w)
    resources.apply(_job(ns, "second", 10), ns)

    # The first runs with its flavor's node labels; the second has a Workload Kueue does not admit (no quota left):
    # it is suspended and has no pods.
    (pod,) = _wait("first's pod", lambda: _pods(resources, ns, "first"))
    assert pod["spec"]["nodeSelector"] == NODE_LABEL
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/podset"] == "main"
    assert "kueue.x-k8s.io/queue-name" not in pod["metadata"]["labels"]
    waiting = _wait("second's Workload", lambda: _workload(resources, ns, "second"))
    time.sleep(3)  # Kueue has had its chance to admit it
    waiting = _workload(resources, ns, "second")
    assert not _true(waiting, "QuotaReserved") and not _true(waiting, "Admitted"), waiting["status"]
    pending = next(c for c in waiting["status"]["conditions"] if c["type"] == "QuotaReserved")
    assert pending["reason"] == "Pending" and "insufficient" in pending["message"].lower(), pending
    second = _get(resources, ns, "second")
    assert second["spec"]["runPolicy"]["suspend"] is True and second["status"]["phase"] == "Suspended"
    assert _pods(resources, ns, "second") == []
    # The job itself says what it waits for, in Kueue's words (issue 49: only the Workload said it) ...
    said = lambda name, words: next((c["message"] for c in (_get(resources, ns, name).get("status") or {}).get(  # noqa: E731
        "conditions") or [] if c["type"] == "Suspended" and words in c["message"]), None)
    assert _wait("second's Suspended condition naming the quota", lambda: said("second", "Kueue: Pending: "), 60)
    # ... as a job queued in a LocalQueue that does not exist does.
    resources.apply(_job(ns, "lost", 10, **{"kueue.x-k8s.io/queue-name": "nope"}), ns)
    assert "LocalQueue nope doesn't exist" in _wait("lost's Suspended condition", lambda: said("lost", "doesn't exist"), 60)
    resources.request("DELETE", f"{ATJ}/namespaces/{ns}/ascendtrainjobs/lost")
    # The Workload as the operator made it: owned by the job, Kueue's finalizer and label, the pod set.
    meta = admitted["metadata"]
    assert meta["name"].startswith("ascendtrainjob-first-")
    assert meta["finalizers"] == ["kueue.x-k8s.io/resource-in-use"]
    assert meta["ownerReferences"][0]["kind"] == "AscendTrainJob" and meta["ownerReferences"][0]["controller"]
    assert meta["labels"]["kueue.x-k8s.io/job-uid"] == _get(resources, ns, "first")["metadata"]["uid"]
    (pod_set,) = admitted["spec"]["podSets"]
    assert pod_set["name"] == "main" and pod_set["count"] == 1
    assert pod_set["template"]["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "500m"}
    assert admitted["spec"]["queueName"] == "jobs" and admitted["spec"]["priority"] == 0

    first = _phase(resources, ns, "first", "Succeeded", "Failed")
    assert first["phase"] == "Succeeded", first
    done = _wait("first's Workload not finished", lambda: (w := _workload(resources, ns, "first"))
                 and _true(w, "Finished") and not w["metadata"].get("finalizers") and w)
    assert next(c for c in done["status"]["conditions"] if c["type"] == "Finished")["reason"] == "Succeeded"
    second = _phase(resources, ns, "second", "Succeeded", "Failed")
    assert second["phase"] == "Succeeded", second
    # the operator finishes the Workload a reconcile after the job's phase (a clean clone's run read too early)
    reasons = _wait("second's Workload not finished", lambda: "FinishedWorkload" in (
        r := [reason for reason, _ in _events(resources, ns, "second")]) and r)
    assert reasons.index("CreatedWorkload") < reasons.index("Started") < reasons.index("FinishedWorkload"), reasons


@pytest.mark.e2e
def test_higher_priority_job_preempts_and_the_preempted_resumes_from_its_checkpoint(cluster, resources):
    ns = "kueue-preempt"
    _queues(resources, cluster, ns, preemption=True)
    for name, value in (("low", 100), ("high", 1000)):
        resources.apply(_kueue("WorkloadPriorityClass", name, value=value))
    resources.apply(_job(ns, "background", ITERS, **{"kueue.x-k8s.io/priority-class": "low"}), ns)
    _wait("no checkpoint yet", lambda: ((_get(resources, ns, "background").get("status") or {}).get("progress")
                                        or {}).get("lastCheckpointIteration", 0) >= 5, 300)
    resources.apply(_job(ns, "urgent", 10, **{"kueue.x-k8s.io/priority-class": "high"}), ns)

    # Kueue evicts the low-priority Workload; the operator suspends the job and, once its pods are gone, gives the
    # quota back; the urgent job runs and finishes.
    evicted = _wait("background not evicted", lambda: (w := _workload(resources, ns, "background"))
                    and any(c["type"] == "Evicted" and c["reason"] == "Preempted" for c in w["status"]["conditions"])
                    and w)
    assert evicted["spec"]["priority"] == 100
    suspended = _phase(resources, ns, "background", "Suspended")
    assert "evicted by Kueue" in next(c for c in suspended["conditions"] if c["type"] == "Suspended")["message"]
    urgent = _phase(resources, ns, "urgent", "Succeeded", "Failed")
    assert urgent["phase"] == "Succeeded", urgent

    # Readmitted, the background job resumes from the checkpoint it saved and finishes.
    final = _phase(resources, ns, "background", "Succeeded", "Failed")
    assert final["phase"] == "Succeeded" and final["progress"]["iteration"] == ITERS, final
    log = (cluster.root / "pods" / ns / "background-0-0" / "container.log").read_text()
    loaded = [int(m) for m in re.findall(r"^loaded checkpoint \S+ at iteration (\d+)$", log, re.M)]
    assert loaded and 5 <= loaded[0] < ITERS, log[-3000:]  # stopped mid-run, resumed from there
    # The Workload's Finished condition follows the job's Succeeded phase in a later reconcile.
    _wait("background's Workload not finished", lambda: (w := _workload(resources, ns, "background"))
          and _true(w, "Finished"))
    events = _events(resources, ns, "background")
    assert sum(n for r, n in events if r == "Started") == 2 and ("Stopped", 1) in events, events


@pytest.mark.operator
def test_without_kueue_a_queued_job_stays_suspended_and_says_why(operator, api_client, namespace):
    """The session's control plane has no Kueue: the job is suspended before anything is made, and one Warning
    event says that Kueue's API is not served."""
    body = job("orphan")
    body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "jobs"}
    create(api_client, namespace, body)
    wait_for(lambda: (get_job(api_client, namespace, "orphan").get("status") or {}).get("phase") == "Suspended",
             what="Suspended")
    assert get_job(api_client, namespace, "orphan")["spec"]["runPolicy"]["suspend"] is True
    events = wait_for(lambda: [e for e in client.CoreV1Api(api_client).list_namespaced_event(namespace).items
                               if e.reason == "KueueNotInstalled"], what="the KueueNotInstalled event")
    assert "kueue.x-k8s.io/v1beta2" in events[0].message and events[0].type == "Warning"
    assert pods_of(api_client, namespace, "orphan") == []


# -- gang scheduling and topology ----------------------------------------------------------------------------------

def _namespace(resources: ResourceClient, cluster: LocalCluster, namespace: str) -> None:
    resources.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    create_workspace(cluster, namespace)


def _sleeper(namespace: str, name: str, seconds: int) -> dict:
    """A 3-pod gang of kube-scheduler's whose pods each take a node's 2 devices and sleep: the gang's placement is
    the point, not what it runs."""
    return {"apiVersion": "ascendtrain.dev/v1alpha1", "kind": "AscendTrainJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"image": "sleeper:1", "nnodes": 3, "nprocPerNode": 2, "devices": {"resource": DEVICE},
                     "shmSize": "none", "gangScheduling": "kubernetes", "terminationGracePeriodSeconds": 30,
                     "trainer": {"command": ["python3", "-c", f"import time; time.sleep({seconds})"],
                                 "progress": "none"}}}


def _pod_groups(resources: ResourceClient, namespace: str) -> str:
    """The path of kube-scheduler's PodGroups at the version the cluster serves (v1alpha2 on 1.36, v1alpha3 on
    1.37)."""
    served = {v["version"] for v in resources.request("GET", "/apis/scheduling.k8s.io")["versions"]}
    version = next(v for v in ("v1alpha3", "v1alpha2") if v in served)  # the group's v1 is PriorityClass's
    return f"/apis/scheduling.k8s.io/{version}/namespaces/{namespace}/podgroups"


def _bound(resources: ResourceClient, namespace: str) -> dict[str, set[str]]:
    """Each PodGroup's live pods (not finished, not being deleted) bound to a node: group -> pod names."""
    out: dict[str, set[str]] = {}
    for pod in resources.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]:
        group = (pod["spec"].get("schedulingGroup") or {}).get("podGroupName")
        if group is None:
            continue
        out.setdefault(group, set())
        if pod["spec"].get("nodeName") and not pod["metadata"].get("deletionTimestamp") and \
                pod["status"].get("phase") not in ("Succeeded", "Failed"):
            out[group].add(pod["metadata"]["name"])
    return out


@pytest.mark.e2e
def test_gangs_are_bound_whole_or_not_at_all_by_kube_scheduler(cluster, resources):
    ns, gang = "gang", 3
    _namespace(resources, cluster, ns)
    partial: dict[str, float] = {}  # group -> since when it has been bound in part
    seen: list[dict[str, int]] = []

    def watch() -> dict[str, set[str]]:
        """The invariant, checked at every look: no group stays bound in part (binding a gang's pods takes a few
        requests, so a part may show for a moment), and while one gang holds its nodes the other holds none."""
        bound = _bound(resources, ns)
        now = time.monotonic()
        counts = {g: len(p) for g, p in bound.items()}
        if not seen or seen[-1] != counts:
            seen.append(counts)
        for group, count in counts.items():
            if 0 < count < gang:
                assert now - partial.setdefault(group, now) < 3.0, f"{group} bound in part: {seen}"
            else:
                partial.pop(group, None)
        assert sum(1 for c in counts.values() if c == gang) <= 1, seen  # 4 nodes hold one gang of 3 at a time
        return bound

    def until(what, predicate, seconds=120):
        deadline = time.monotonic() + seconds
        while not (found := predicate(watch())):
            assert time.monotonic() < deadline, f"{what}: {seen}"
            time.sleep(0.25)
        return found

    resources.apply(_sleeper(ns, "left", 20), ns)
    resources.apply(_sleeper(ns, "right", 20), ns)
    # One gang is bound whole (its PodGroup <job>-0, minCount 3); the other has no pod bound: 1 node is left.
    first = until("no gang bound", lambda b: next((g for g, p in b.items() if len(p) == gang), None))
    job, other = first.rsplit("-", 1)[0], ({"left", "right"} - {first.rsplit("-", 1)[0]}).pop()
    group = resources.request("GET", f"{_pod_groups(resources, ns)}/{first}")
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": gang}}
    assert group["metadata"]["ownerReferences"][0]["name"] == job
    assert watch().get(f"{other}-0") == set()
    until(f"{job} not running", lambda b: _get(resources, ns, job).get("status", {}).get("phase") == "Running")
    # A node of the running gang is lost: the gang restarts (attempt 1, PodGroup <job>-1) away from that node, and
    # on the 3 nodes left one of the two gangs is bound whole, the other not at all.
    lost = next(p["spec"]["nodeName"] for p in _pods(resources, ns, job) if p["metadata"]["name"] == f"{job}-1-0")
    cluster.lose_node(lost)
    until(f"{job} not restarted", lambda b: (_get(resources, ns, job).get("status") or {}).get("restarts") == 1)
    winner = until("neither gang bound after the loss", lambda b: next(
        (g for g, p in b.items() if len(p) == gang and g != first), None))
    waiting = f"{job}-1" if winner == f"{other}-0" else f"{other}-0"
    assert watch().get(waiting, set()) == set(), seen
    cluster.add_node(lost)  # back, with one node free: still not enough for the waiting gang
    for name in (job, other):
        until(f"{name} not finished", lambda b: _get(resources, ns, name).get("status", {}).get("phase")
              in ("Succeeded", "Failed"), 240)
    for name in (job, other):
        status = _get(resources, ns, name)["status"]
        assert status["phase"] == "Succeeded", status
    status = _get(resources, ns, job)["status"]
    assert status["restarts"] == 1 and [a["node"] for a in status.get("avoidedNodes") or []] == [lost], status
    # The older attempt's PodGroup went with its restart; each gang was bound whole, once or twice.
    groups = {g["metadata"]["name"] for g in resources.request("GET", _pod_groups(resources, ns))["items"]}
    assert groups == {f"{job}-1", f"{other}-0"}, groups
    print(f"bound pods per PodGroup, each change: {seen}")


def _tp2_pp2(namespace: str, name: str, **spec) -> dict:
    """The quickstart's model at TP2 x PP2 on 4 one-device pods (DP 1), a few steps."""
    body = quickstart_job()
    body["metadata"].update(name=name, namespace=namespace)
    body["spec"].update(nnodes=4, nprocPerNode=1, devices={"resource": DEVICE}, **spec)
    train = body["spec"]["train"]
    train["parallel"].update(tensorModelParallelSize=2, pipelineModelParallelSize=2)
    train["training"]["trainIters"] = 6
    train["checkpoint"]["save"] = f"/workspace/checkpoints/{name}"
    train["observability"]["logInterval"] = 1
    return body


def _placed(cluster: LocalCluster, resources: ResourceClient, namespace: str, name: str) -> tuple[dict, dict]:
    """The finished job's status, and each NODE_RANK's node (from the pods' annotations, checked against the
    status's order and the pods' own log line)."""
    status = _phase(resources, namespace, name, "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", status
    pods = {p["metadata"]["name"]: p for p in _pods(resources, namespace, name)}
    order = [int(i) for part in status["placement"]["podsByRank"].split(",") for i in (
        range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1))]
    nodes = {}
    for rank, index in enumerate(order):
        pod = pods[f"{name}-{index}-0"]
        assert pod["metadata"]["annotations"]["ascendtrain.dev/node-rank"] == str(rank)
        nodes[rank] = pod["spec"]["nodeName"]
        if index:
            log = (cluster.root / "pods" / namespace / f"{name}-{index}-0" / "container.log").read_text()
            assert f"NODE_RANK {rank} (ordered by topology)" in log, log[-2000:]
    return status, nodes


@pytest.mark.e2e
def test_ranks_are_ordered_by_topology_under_kube_scheduler_and_kueue(cluster, resources):
    ns = "topology"
    _namespace(resources, cluster, ns)
    # kube-scheduler alone: the gang's PodGroup holds it to one rack (2 nodes of 2 devices), so 2 pods share each
    # node; which 2 is kube-scheduler's choice, and the operator orders the ranks so each TP pair shares one.
    resources.apply(_tp2_pp2(ns, "in-rack", gangScheduling="kubernetes", topology={
        "required": topology.RACK, "tensorParallel": topology.HOST}), ns)
    status, nodes = _placed(cluster, resources, ns, "in-rack")
    assert status["placement"]["domains"] == {topology.BLOCK: 1, topology.RACK: 1, topology.HOST: 2}, status
    assert status["placement"]["tensorParallelGroups"] == 2 and status["placement"]["tensorParallelGroupsSplit"] == 0
    assert nodes[0] == nodes[1] and nodes[2] == nodes[3] and nodes[0] != nodes[2], nodes
    in_rack = status

    # Kueue's topology-aware scheduling: a TAS flavor over the cluster's Topology; the pod set asks for one block
    # and slices of 2 pods (a TP group) per host; Kueue's ungater gives each pod its node. The gang is also
    # kube-scheduler's (its PodGroup): the two work together.
    resources.apply(_kueue("ResourceFlavor", f"{ns}-tas", {"nodeLabels": NODE_LABEL,
                                                         "topologyName": topology.TOPOLOGY_NAME}))
    resources.apply(_kueue("ClusterQueue", ns, {"namespaceSelector": {}, "resourceGroups": [{
        "coveredResources": ["cpu", DEVICE], "flavors": [{"name": f"{ns}-tas", "resources": [
            {"name": "cpu", "nominalQuota": "4"}, {"name": DEVICE, "nominalQuota": "8"}]}]}]}))
    queue = _kueue("LocalQueue", "jobs", {"clusterQueue": ns})
    queue["metadata"]["namespace"] = ns
    resources.apply(queue, ns)
    body = _tp2_pp2(ns, "by-kueue", gangScheduling="kubernetes", topology={
        "required": topology.BLOCK, "tensorParallel": topology.HOST})
    body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "jobs"}
    resources.apply(body, ns)
    admitted = _wait("by-kueue not admitted", lambda: (w := _workload(resources, ns, "by-kueue"))
                     and _true(w, "Admitted") and w)
    (pod_set,) = admitted["spec"]["podSets"]
    assert pod_set["topologyRequest"] == {"required": topology.BLOCK, "podIndexLabel": "ascendtrain.dev/replica-index",
                                          "podSetSliceRequiredTopology": topology.HOST, "podSetSliceSize": 2}
    assert admitted["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]["levels"][-1] == \
        topology.HOST
    status, nodes = _placed(cluster, resources, ns, "by-kueue")
    assert status["placement"]["tensorParallelGroupsSplit"] == 0
    assert nodes[0] == nodes[1] and nodes[2] == nodes[3], nodes
    pod = _pods(resources, ns, "by-kueue")[0]
    assert pod["spec"]["nodeSelector"][topology.HOST] == pod["spec"]["nodeName"]  # Kueue's choice, kept
    assert not pod["spec"].get("schedulingGates") and pod["metadata"]["annotations"]["kueue.x-k8s.io/workload"]
    # Training is the same whatever the order: each global rank does the same arithmetic wherever its pod runs
    # (gloo's collectives order by rank, not by host), so the two runs' losses are equal to the last bit.
    assert status["progress"]["loss"] == in_rack["progress"]["loss"], (status["progress"], in_rack["progress"])
    print(f"placements: kube-scheduler {in_rack['placement']}, Kueue {status['placement']}")
