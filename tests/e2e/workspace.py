"""The quickstart's two documents (its workspace claim and its job), and the claim for jobs written in a test.

On a real control plane a pod whose PersistentVolumeClaim does not exist is not scheduled, so every job that mounts
``ascend-workspace`` needs the claim first; the local cluster's provisioner backs it with
``<root>/pvc/<namespace>/<claim>``."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"
_CLAIM, _JOB = (doc for doc in yaml.safe_load_all(QUICKSTART.read_text()) if doc)


def quickstart_job() -> dict[str, Any]:
    """The quickstart's AscendTrainJob (a fresh copy)."""
    return copy.deepcopy(_JOB)


def create_workspace(cluster, namespace: str = "default", name: str = "ascend-workspace") -> Path:
    """Create the quickstart's claim (as ``name`` in ``namespace``); returns the host directory behind it."""
    claim = copy.deepcopy(_CLAIM)
    claim["metadata"].update(name=name, namespace=namespace)
    with cluster.client() as resources:
        resources.apply(claim, namespace)
    return cluster.root / "pvc" / namespace / name
