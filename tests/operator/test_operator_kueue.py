"""Kueue for real: Kueue's own manager (built from its module, ``ascend_cluster.kueue``) admits AscendTrainJobs
through the Workloads the operator makes for them, as the controller of an external framework does.

One local cluster for both tests (control plane, one node, the operator, Kueue); each test has a namespace, a
ClusterQueue with quota for one job (500m CPU, what a job's one pod requests) and a LocalQueue of its own.

* Two jobs queued: the first is admitted and runs with its flavor's node selector; the second waits (its
  Workload pending, the job suspended, no pods) and runs once the first has finished and given its quota back.
* Preemption: a higher-priority job (WorkloadPriorityClass) evicts a running one; its pods stop (the engine saves
  a checkpoint on SIGTERM), its quota goes to the preemptor, and once readmitted it resumes from its checkpoint
  (rank 0 loads an iteration > 0) and finishes at its last iteration.

Without Kueue (the session's control plane), a queued job stays suspended and a Warning event says why.
"""
from __future__ import annotations

import re
import time

import pytest
from kubernetes import client

from ascend_cluster.cluster import LocalCluster
from ascend_cluster.resource_client import ResourceClient
from e2e.workspace import create_workspace, quickstart_job
from test_operator_train_job import create, get_job, job, operator, pods_of, wait_for  # noqa: F401

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
ATJ = "/apis/ascendtrain.dev/v1alpha1"
NODE_LABEL = {"kubernetes.io/hostname": "local"}  # the one node's; the flavor's nodeLabels
ITERS = 150  # the preempted job's: far from done (~0.1 s an iteration) when the preemptor comes at iteration 5+


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(root=tmp_path_factory.mktemp("kueue") / "cluster", operator=True, kueue=True,
                      fast_storage=True) as local:
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
