"""DatasetPrep / CheckpointConvert -> a ConfigMap and one pod running ``ascend-engine <command>``."""
from __future__ import annotations

from typing import Any

from ascend_engine.config.base import EngineModel

from ..api.group import LABEL_REPLICA_INDEX
from ..api.single_pod import SinglePodSettings
from .common import CONFIG_FILE, POD_IP_ENV, config_map, container, job_labels, metrics_port_env, pod_spec


def pod(kind: str, name: str, settings: SinglePodSettings, command: str) -> dict[str, Any]:
    device = settings.devices.extended_resource()
    limits = {device: "1"} if device else {}
    env = [POD_IP_ENV, metrics_port_env(settings.metricsPort)]
    main = container(settings, ["ascend-engine", command, "--config", CONFIG_FILE], env, limits)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{name}-0", "labels": job_labels(kind, name) | {LABEL_REPLICA_INDEX: "0"}},
        "spec": pod_spec(settings, name, main),
    }


def objects(kind: str, name: str, settings: SinglePodSettings, engine: EngineModel,
            command: str) -> list[dict[str, Any]]:
    return [config_map(kind, name, engine.to_yaml_dict()), pod(kind, name, settings, command)]
