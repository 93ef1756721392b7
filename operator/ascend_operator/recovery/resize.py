"""The train job's elastic hooks for the lifecycle: render at the current size, and resize when due
(``ascend_operator.recovery.elastic`` decides; this module gives it the cluster's capacity from the API)."""
from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from kubernetes.client.rest import ApiException

from . import elastic
from ..faults import infra_fault
from ..api.group import LABEL_JOB_KIND, LABEL_JOB_NAME, TRAIN_JOB
from ..api.train_job import AscendTrainJobSpec
from .capacity import pods_that_fit
from ..cache.job_pods import JobPods
from ..render import train_job as render
from ..kinds import host_network
from ..client.kubeclient import kube

logger = logging.getLogger(__name__)


def prepare(obj: dict[str, Any], spec: AscendTrainJobSpec, status: dict[str, Any]
            ) -> tuple[AscendTrainJobSpec, dict[str, Any]]:
    """Host ports, then the current size of an elastic job."""
    spec, ports = host_network.prepare(obj, spec, status)
    spec, sized = elastic.prepare(spec, status)
    return spec, {**ports, **sized}


def _capacity(name: str, namespace: str, spec: AscendTrainJobSpec, avoided: list[str]) -> int | None:
    """How many of this job's pods the nodes hold, kept off the ``avoided`` nodes as the pods will be (None: the
    operator may not list nodes or pods)."""
    try:
        nodes, pods = kube().list_nodes(), kube().list_live_pods()
    except ApiException as e:
        if e.status != 403:
            raise
        logger.warning("%s/%s: cannot count capacity (%s); an elastic job then scales in one size at a time and "
                       "does not scale out", namespace, name, e.reason)
        return None

    def own(pod: dict[str, Any]) -> bool:
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        return meta.get("namespace") == namespace and labels.get(LABEL_JOB_NAME) == name and \
            labels.get(LABEL_JOB_KIND) == TRAIN_JOB.kind

    shape = render.pod(name, namespace, spec, 0)
    infra_fault.avoid_nodes([shape], avoided)
    return pods_that_fit(nodes, pods, shape, own)


def resize(obj: dict[str, Any], desired: AscendTrainJobSpec, status: dict[str, Any],
           pods: JobPods) -> tuple[dict[str, Any], str, str] | None:
    """``elastic.resize`` for this job, ``desired`` being its spec before ``prepare`` (nnodes: the desired size)."""
    if desired.elastic is None:
        return None
    name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
    avoided = [a["node"] for a in status.get("avoidedNodes") or []]
    return elastic.resize(desired, status, pods, lambda: _capacity(name, namespace, desired, avoided),
                          dt.datetime.now(dt.timezone.utc))
