"""AscendTrainJob -> headless Service, ConfigMap and one pod per node with torchrun's environment contract."""
from __future__ import annotations

from typing import Any

from ..api.group import LABEL_REPLICA_INDEX, TRAIN_JOB
from ..api.train_job import AscendTrainJobSpec
from .common import CONFIG_FILE, POD_IP_ENV, config_map, container, env_list, job_labels, pod_spec

KIND = TRAIN_JOB.kind


def master_addr(name: str, namespace: str) -> str:
    """Pod 0's stable DNS name behind the headless Service (hostname.subdomain.namespace.svc)."""
    return f"{name}-0.{name}.{namespace}.svc"


def service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": job_labels(KIND, name)},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,  # workers must resolve the master before it is Ready
            "selector": job_labels(KIND, name),
        },
    }


def engine_config_map(name: str, spec: AscendTrainJobSpec) -> dict[str, Any]:
    return config_map(KIND, name, spec.train.to_yaml_dict())


def torchrun_env(name: str, namespace: str, spec: AscendTrainJobSpec, index: int) -> dict[str, str]:
    """torchrun's contract plus the PET_* twins torchrun reads by itself (as Kubeflow sets them)."""
    contract = {
        "MASTER_ADDR": master_addr(name, namespace),
        "MASTER_PORT": str(spec.masterPort),
        "NNODES": str(spec.nnodes),
        "NODE_RANK": str(index),
        "NPROC_PER_NODE": str(spec.nprocPerNode),
        "WORLD_SIZE": str(spec.world_size),
    }
    env = dict(contract)
    env.update({f"PET_{k}": v for k, v in contract.items() if k != "WORLD_SIZE"})
    if spec.devices.is_ascend():
        env["HCCL_CONNECT_TIMEOUT"] = str(spec.hccl.connectTimeout)
        if spec.hccl.ifBasePort is not None:
            env["HCCL_IF_BASE_PORT"] = str(spec.hccl.ifBasePort)
        if spec.hccl.socketIfname:
            env["HCCL_SOCKET_IFNAME"] = spec.hccl.socketIfname
    return env


TORCHRUN = [
    "torchrun",
    "--nnodes=$(NNODES)", "--nproc-per-node=$(NPROC_PER_NODE)", "--node-rank=$(NODE_RANK)",
    "--master-addr=$(MASTER_ADDR)", "--master-port=$(MASTER_PORT)",
    "-m", "ascend_engine", "train", "--config", CONFIG_FILE,
]


def pod(name: str, namespace: str, spec: AscendTrainJobSpec, index: int) -> dict[str, Any]:
    labels = job_labels(KIND, name) | {LABEL_REPLICA_INDEX: str(index)}
    if spec.devices.is_ascend() and spec.devices.ringController:
        labels["ring-controller.atlas"] = spec.devices.ringController
    limits = {spec.devices.resource: str(spec.nprocPerNode)} if spec.devices.resource else {}
    env = env_list(torchrun_env(name, namespace, spec, index)) + [POD_IP_ENV]
    main = container(spec, TORCHRUN, env, limits)
    body = pod_spec(spec, name, main)
    body.update({"hostname": f"{name}-{index}", "subdomain": name})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{name}-{index}", "labels": labels},
        "spec": body,
    }


def objects(name: str, namespace: str, spec: AscendTrainJobSpec) -> list[dict[str, Any]]:
    """Everything one job needs, in creation order (the ConfigMap before the pods that mount it)."""
    return [service(name), engine_config_map(name, spec)] + [pod(name, namespace, spec, i) for i in range(spec.nnodes)]
