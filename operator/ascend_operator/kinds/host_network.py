"""Assign each hostNetwork AscendTrainJob its own block of node ports (see render/host_ports.py).

The block is kept in status.hostPorts, so it survives operator restarts; blocks of other live jobs (from the
API, and those this process handed out but has not written yet) are never reused.
"""
from __future__ import annotations

import threading
from typing import Any

from ..api.group import TRAIN_JOB
from ..api.train_job import AscendTrainJobSpec
from ..render import host_ports
from ..settings import HOST_PORT_BLOCK, HOST_PORT_FIRST, HOST_PORT_LAST
from ..lifecycle.status import TERMINAL
from ..client.kubeclient import kube

_LOCK = threading.Lock()
_HANDED_OUT: dict[str, int] = {}  # job uid -> block, until the job's status says so


def _taken_by_others(uid: str) -> set[int]:
    taken = {b for u, b in _HANDED_OUT.items() if u != uid}
    for job in kube().list_custom(TRAIN_JOB.kind):
        status = job.get("status") or {}
        if job["metadata"]["uid"] != uid and status.get("hostPorts") and status.get("phase") not in TERMINAL:
            taken.add(status["hostPorts"]["block"])
    return taken


def prepare(obj: dict[str, Any], spec: AscendTrainJobSpec, status: dict[str, Any]
            ) -> tuple[AscendTrainJobSpec, dict[str, Any]]:
    """The spec with the job's ports, and status.hostPorts to record (empty without hostNetwork)."""
    if not spec.hostNetwork:
        return spec, {}
    assigned = status.get("hostPorts")
    if not assigned:
        uid = obj["metadata"]["uid"]
        with _LOCK:
            blocks = host_ports.blocks_in(HOST_PORT_FIRST, HOST_PORT_LAST, HOST_PORT_BLOCK)
            block = _HANDED_OUT.get(uid)
            if block is None:
                block = _HANDED_OUT[uid] = host_ports.choose_block(uid, _taken_by_others(uid), blocks)
        assigned = host_ports.ports(block, HOST_PORT_FIRST, HOST_PORT_BLOCK)
    spec = spec.model_copy(deep=True)
    spec.masterPort = assigned["masterPort"]
    if spec.train:  # evaluate serves no metrics
        spec.train.observability.metricsPort = assigned["metricsPort"]
    if spec.trainer:
        spec.trainer.metricsPort = assigned["metricsPort"]
    if spec.hccl.ifBasePort is None:
        spec.hccl.ifBasePort = assigned["hcclIfBasePort"]
    return spec, {"hostPorts": assigned}
