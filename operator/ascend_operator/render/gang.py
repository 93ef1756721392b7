"""Gang scheduling: the PodGroup that makes a scheduler place all of a job's pods together or none.

Volcano (``scheduling.volcano.sh/v1beta1``) finds the group through the pod annotation
``scheduling.k8s.io/group-name``; the scheduler-plugins coscheduling plugin (``scheduling.x-k8s.io/v1alpha1``)
through the pod label ``scheduling.x-k8s.io/pod-group``.
"""
from __future__ import annotations

from typing import Any

from ..api.train_job import AscendTrainJobSpec
from .common import job_labels

VOLCANO = ("scheduling.volcano.sh/v1beta1", "scheduling.k8s.io/group-name")
COSCHEDULING = ("scheduling.x-k8s.io/v1alpha1", "scheduling.x-k8s.io/pod-group")


def pod_group(kind: str, name: str, spec: AscendTrainJobSpec) -> dict[str, Any] | None:
    if spec.gangScheduling is None:
        return None
    body: dict[str, Any] = {"minMember": spec.nnodes}
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
    if spec.gangScheduling == "volcano":
        pod["metadata"].setdefault("annotations", {})[VOLCANO[1]] = name
        pod["spec"].setdefault("schedulerName", "volcano")
    elif spec.gangScheduling == "coscheduling":
        pod["metadata"]["labels"][COSCHEDULING[1]] = name
