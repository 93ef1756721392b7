"""Gang scheduling: the group object that makes a scheduler place all of a job's pods together or none.

* ``kubernetes``: kube-scheduler's own gang scheduling (KEP-4671, Kubernetes 1.36+, feature gate GenericWorkload;
  the API group ``scheduling.k8s.io`` at v1alpha2 in 1.36 and v1alpha3 in 1.37, whose PodGroup spec holds the same
  two fields used here). A PodGroup is the runtime instance of one gang, and a pod's ``spec.schedulingGroup`` is
  immutable: so each attempt (gang start) gets a PodGroup of its own, ``<job>-<attempt>`` (``per_attempt``:
  ``lifecycle.attempts.stamp`` names it), policy ``gang`` with ``minCount`` = the attempt's pod count, and with
  ``spec.topology.required`` the topology constraint kube-scheduler keeps the whole group in (feature gate
  TopologyAwareWorkloadScheduling). kube-scheduler schedules the group's pods in one pod-group cycle and binds
  them only when all fit: no pod of a gang that cannot fit is bound. The API version is the newest the cluster
  serves (``client.kubeclient``).
* ``volcano`` (``scheduling.volcano.sh/v1beta1``) finds the group through the pod annotation
  ``scheduling.k8s.io/group-name``; the scheduler-plugins coscheduling plugin (``scheduling.x-k8s.io/v1alpha1``)
  through the pod label ``scheduling.x-k8s.io/pod-group``. One PodGroup per job. Rendered as those schedulers
  document, never run against them here: neither module is served by the Go module proxy this project builds from.
"""
from __future__ import annotations

from typing import Any

from ..api.group import LABEL_ATTEMPT
from ..api.train_job import AscendTrainJobSpec
from .common import job_labels

VOLCANO = ("scheduling.volcano.sh/v1beta1", "scheduling.k8s.io/group-name")
COSCHEDULING = ("scheduling.x-k8s.io/v1alpha1", "scheduling.x-k8s.io/pod-group")
KUBERNETES_GROUP = "scheduling.k8s.io"
KUBERNETES = f"{KUBERNETES_GROUP}/v1alpha3"  # the version the client resolves to the one served (same fields)


def pod_group(kind: str, name: str, spec: AscendTrainJobSpec) -> dict[str, Any] | None:
    if spec.gangScheduling is None:
        return None
    if spec.gangScheduling == "kubernetes":
        body: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": spec.nnodes}}}
        if spec.topology is not None and spec.topology.required:
            body["schedulingConstraints"] = {"topology": [{"key": spec.topology.required}]}
        return {"apiVersion": KUBERNETES, "kind": "PodGroup",
                "metadata": {"name": name, "labels": job_labels(kind, name)}, "spec": body}
    body = {"minMember": spec.nnodes}
    if spec.gangScheduling == "volcano":
        api_version = VOLCANO[0]
        if spec.volcanoQueue:
            body["queue"] = spec.volcanoQueue
        if spec.priorityClassName:
            body["priorityClassName"] = spec.priorityClassName
    else:
        api_version = COSCHEDULING[0]
    return {"apiVersion": api_version, "kind": "PodGroup",
            "metadata": {"name": name, "labels": job_labels(kind, name)}, "spec": body}


def mark_pod(pod: dict[str, Any], name: str, spec: AscendTrainJobSpec) -> None:
    """Tie a pod to the job's PodGroup (and to Volcano's scheduler unless the user chose one)."""
    if spec.gangScheduling == "kubernetes":
        pod["spec"]["schedulingGroup"] = {"podGroupName": name}
    elif spec.gangScheduling == "volcano":
        pod["metadata"].setdefault("annotations", {})[VOLCANO[1]] = name
        pod["spec"].setdefault("schedulerName", "volcano")
    elif spec.gangScheduling == "coscheduling":
        pod["metadata"]["labels"][COSCHEDULING[1]] = name


def per_attempt(obj: dict[str, Any]) -> bool:
    """Whether ``obj`` is a group made for each attempt (kube-scheduler's PodGroup) rather than once per job."""
    return obj["kind"] == "PodGroup" and obj["apiVersion"].startswith(f"{KUBERNETES_GROUP}/")


def group_name(job: str, attempt: int) -> str:
    """The PodGroup of one attempt: the attempt follows the last dash, so two jobs' groups never share a name."""
    return f"{job}-{attempt}"


def stamp(objects: list[dict[str, Any]], job: str, attempt: int) -> None:
    """Name a per-attempt PodGroup, and the pods' reference to it, for ``attempt``."""
    name = group_name(job, attempt)
    for o in objects:
        if per_attempt(o):
            o["metadata"]["name"] = name
            o["metadata"]["labels"] = {**o["metadata"].get("labels", {}), LABEL_ATTEMPT: str(attempt)}
        elif o["kind"] == "Pod" and "schedulingGroup" in o["spec"]:
            o["spec"]["schedulingGroup"] = {"podGroupName": name}
