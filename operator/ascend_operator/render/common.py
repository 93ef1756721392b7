"""Pieces every kind's pods share: labels, the engine ConfigMap, the container and pod skeleton."""
from __future__ import annotations

from typing import Any

from kubernetes.utils import parse_quantity

from ..api.group import LABEL_JOB_KIND, LABEL_JOB_NAME
from ..api.kube import PodSettings
from . import yaml_text
from .security import container_security, pod_security

from ascend_engine.telemetry import METRICS_PORT_ENV, TERMINATION_LOG_ENV

TERMINATION_LOG = "/dev/termination-log"
CONFIG_MOUNT = "/etc/ascendtrain"
CONFIG_FILE = f"{CONFIG_MOUNT}/config.yaml"


def job_labels(kind: str, name: str) -> dict[str, str]:
    return {LABEL_JOB_NAME: name, LABEL_JOB_KIND: kind, "app.kubernetes.io/managed-by": "ascend-train-operator"}


def dump_yaml(data: Any) -> str:
    """``yaml.safe_dump(data, sort_keys=False)``, the same text through a faster path (``yaml_text``)."""
    return yaml_text.dump(data)


def config_map(kind: str, name: str, engine_config: dict[str, Any]) -> dict[str, Any]:
    """The engine config the pod reads with ``--config``; the engine validates it again with the same model."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-config", "labels": job_labels(kind, name)},
        "data": {"config.yaml": dump_yaml(engine_config)},
    }


def thread_env(settings: PodSettings, processes: int) -> list[dict[str, Any]]:
    """``OMP_NUM_THREADS`` from the container's CPU limit (else its request), shared by its processes.

    torch sizes its thread pool by the node's cores, not by the container's CPU quota: two CPU pods on one
    node each start a thread per core and slow each other down by an order of magnitude (and a CPU-limited
    container is throttled). The user's own ``OMP_NUM_THREADS`` wins; without a CPU figure nothing is set."""
    cpu = settings.resources.limits.get("cpu") or settings.resources.requests.get("cpu")
    if not cpu or any(e.name == "OMP_NUM_THREADS" for e in settings.env):
        return []
    return [{"name": "OMP_NUM_THREADS", "value": str(max(1, int(parse_quantity(cpu)) // processes))}]


def container(settings: PodSettings, command: list[str], env: list[dict[str, Any]],
              extra_limits: dict[str, str] | None = None, processes: int = 1) -> dict[str, Any]:
    resources = {k: dict(v) for k, v in (("requests", settings.resources.requests),
                                           ("limits", settings.resources.limits)) if v}
    for key, value in (extra_limits or {}).items():  # extended resources: requests must equal limits
        resources.setdefault("requests", {})[key] = value
        resources.setdefault("limits", {})[key] = value
    mounts = [{"name": "engine-config", "mountPath": CONFIG_MOUNT, "readOnly": True}]
    if settings.shm_size_limit():
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    return {
        "name": "engine",
        "image": settings.image,
        "imagePullPolicy": settings.imagePullPolicy,
        "command": command,
        "env": env + [{"name": TERMINATION_LOG_ENV, "value": TERMINATION_LOG}] + thread_env(settings, processes)
        + [e.to_pod() for e in settings.env],
        # The engine's final report (JSON) comes back in status.containerStatuses[].state.terminated.message.
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "resources": resources,
        "volumeMounts": mounts + list(settings.volumeMounts),
        "securityContext": container_security(settings),
    } | ({"envFrom": list(settings.envFrom)} if settings.envFrom else {})


def pod_spec(settings: PodSettings, name: str, main: dict[str, Any]) -> dict[str, Any]:
    volumes: list[dict[str, Any]] = [{"name": "engine-config", "configMap": {"name": f"{name}-config"}}]
    if settings.shm_size_limit():
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": settings.shm_size_limit()}})
    spec: dict[str, Any] = {
        "restartPolicy": "Never",  # restarts are the operator's decision (gang restart), not the kubelet's
        "terminationGracePeriodSeconds": settings.terminationGracePeriodSeconds,
        "containers": [main],
        "volumes": volumes + list(settings.volumes),
        **pod_security(settings),
    }
    optional = {
        "serviceAccountName": settings.serviceAccountName,
        "schedulerName": settings.schedulerName,
        "priorityClassName": settings.priorityClassName,
        "nodeSelector": settings.nodeSelector or None,
        "tolerations": settings.tolerations or None,
        "affinity": settings.affinity or None,
        "imagePullSecrets": [{"name": s} for s in settings.imagePullSecrets] or None,
    }
    spec.update({k: v for k, v in optional.items() if v is not None})
    return spec


def env_list(values: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": k, "value": str(v)} for k, v in values.items()]


def metrics_port_env(port: int) -> dict[str, Any]:
    return {"name": METRICS_PORT_ENV, "value": str(port)}


POD_IP_ENV = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
