"""AscendTrainJob -> headless Service, ConfigMap and one pod per node with torchrun's environment contract."""
from __future__ import annotations

import shlex
from typing import Any

from ascend_engine.config.tracking import JOB_NAME_ENV, JOB_NAMESPACE_ENV
from ascend_engine.node_rank import NODE_RANK_ANNOTATION, TIMEOUT_ENV as NODE_RANK_TIMEOUT_ENV
from ascend_engine.node_rank import POD_INDEX_ENV, WAIT_ENV as NODE_RANK_WAIT_ENV
from ascend_engine.stacks import ANNOTATIONS_FILE_ENV

from ..api.group import LABEL_REPLICA_INDEX, TRAIN_JOB
from ..api.train_job import AscendTrainJobSpec
from ..kueue import topology as kueue_topology
from . import gang
from .common import (CONFIG_FILE, CONFIG_MOUNT, POD_IP_ENV, config_map, container, dump_yaml, env_list, job_labels,
                     metrics_port_env, pod_spec)

KIND = TRAIN_JOB.kind
PODINFO_VOLUME = "ascend-podinfo"
PODINFO_MOUNT = "/etc/ascend-podinfo"

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
    """The TrainConfig; checkpoint.load defaults to checkpoint.save so that restarted pods resume by themselves.
    An evaluation-only job's ConfigMap holds the EvaluateConfig alone."""
    config = spec.train.to_yaml_dict() if spec.train else {}
    checkpoint = config.setdefault("checkpoint", {})
    if checkpoint.get("save") and not checkpoint.get("load"):
        checkpoint["load"] = checkpoint["save"]
    out = config_map(KIND, name, config)
    if not spec.train:  # evaluation-only, or the user's own trainer: no engine config
        out["data"].clear()
    if spec.evaluation:
        out["data"][EVALUATION_FILE.rsplit("/", 1)[1]] = dump_yaml(evaluation_config(spec))
    return out

EVALUATION_FILE = f"{CONFIG_MOUNT}/evaluation.yaml"
EVALUATION_PORT_OFFSET = 2

def evaluation_config(spec: AscendTrainJobSpec) -> dict[str, Any]:
    """The EvaluateConfig; load and device default to the training's."""
    config = spec.evaluation.to_yaml_dict()
    if spec.train:
        config.setdefault("load", spec.train.checkpoint.save)
        config.setdefault("device", spec.train.device)
    return config

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
    # On SIGTERM torchrun forwards it to the workers and waits this long before SIGKILL: the engine's time to
    # finish its step and save (train/preemption.py), bounded by the pod's grace period.
    env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(spec.terminationGracePeriodSeconds - 15)
    if spec.train and not spec.trainer:  # the in-process level (ascend_engine.inprocess), read by the launcher
        recovery = spec.runPolicy.recovery
        env["ASCEND_INPROCESS_RESTARTS"] = str(recovery.inProcessRestarts)
        env["ASCEND_WARM_SPARES"] = str(recovery.warmSpares)
        env["ASCEND_MEMORY_CHECKPOINT"] = "1" if recovery.stateFromMemory else "0"
    if spec.devices.is_ascend():
        env["HCCL_CONNECT_TIMEOUT"] = str(spec.hccl.connectTimeout)
        if spec.hccl.ifBasePort is not None:
            env["HCCL_IF_BASE_PORT"] = str(spec.hccl.ifBasePort)
        if spec.hccl.socketIfname:
            env["HCCL_SOCKET_IFNAME"] = spec.hccl.socketIfname
    return env

LAUNCHER = [
    "python3", "-m", "ascend_engine.launcher",  # torchrun, with a line while it imports torch
    "--nnodes=$(NNODES)", "--nproc-per-node=$(NPROC_PER_NODE)", "--node-rank=$(NODE_RANK)",
    "--master-addr=$(MASTER_ADDR)", "--master-port=$(MASTER_PORT)",
]

def train_launcher(name: str, spec: AscendTrainJobSpec, index: int) -> list[str]:
    """torchrun for training. With in-place restarts (runPolicy.recovery.inPlaceRestarts) the agents meet in a
    c10d rendezvous that pod 0 hosts on masterPort, named after the job, so a failed worker is restarted in
    every pod without the pods being replaced; the engine renumbers the ranks by pod index
    (``ascend_engine.inplace``). Each pod's agent hosts nothing else than pod 0's store on its own address. In-process
    restarts (``ascend_engine.inprocess``) need that rendezvous too: its store coordinates the ranks."""
    recovery = spec.runPolicy.recovery
    restarts = recovery.inPlaceRestarts
    if not restarts and not recovery.inProcessRestarts:
        return list(LAUNCHER)
    return [*LAUNCHER[:3], "--nnodes=$(NNODES)", "--nproc-per-node=$(NPROC_PER_NODE)",
            "--rdzv-backend=c10d", "--rdzv-endpoint=$(MASTER_ADDR):$(MASTER_PORT)", f"--rdzv-id={name}",
            f"--rdzv-conf=is_host={int(index == 0)}", "--local-addr=$(POD_IP)", f"--max-restarts={restarts}"]

def trainer_command(spec: AscendTrainJobSpec, index: int) -> list[str]:
    """The user's command; with progress from its log lines it runs under ``ascend-engine watch``, and workers
    first wait for the master as the engine's do."""
    trainer = spec.trainer
    run = [*trainer.command, *trainer.args]
    if trainer.progress == "none":
        return run
    run = ["ascend-engine", "watch", "--", *run]
    if index == 0:
        return run
    return ["ascend-engine", "wait-for-master", "--addr=$(MASTER_ADDR)", "--port=$(MASTER_PORT)",
            f"--timeout={spec.masterWaitSeconds}", "--", *run]

def command(name: str, spec: AscendTrainJobSpec, index: int) -> list[str]:
    """torchrun; pods other than 0 first wait for the master's name and port (``ascend-engine wait-for-master``
    then execs torchrun), so a worker never fails because pod 0 is still being scheduled or pulled. With an
    evaluation block every pod runs a second torchrun, ``evaluate``, once training has succeeded; without train
    ``evaluate`` is the only one."""
    if spec.trainer:
        return trainer_command(spec, index)
    train = [*train_launcher(name, spec, index), "-m", "ascend_engine", "train", "--config", CONFIG_FILE]
    run = train
    if not spec.train:
        run = [*LAUNCHER, "-m", "ascend_engine", "evaluate", "--config", EVALUATION_FILE]
    elif spec.evaluation:
        # A second rendezvous on MASTER_PORT could reach pod 0's training store while it is still closing; the
        # evaluation meets on MASTER_PORT + 2 (inside a hostNetwork job's port block, below HCCL's ports).
        port = f"--master-port=$((MASTER_PORT + {EVALUATION_PORT_OFFSET}))"
        launcher = [a for a in LAUNCHER if not a.startswith("--master-port=")]
        evaluate = f"{shlex.join(launcher)} {port} -m ascend_engine evaluate --config {EVALUATION_FILE}"
        run = ["sh", "-c", f"{shlex.join(train)} && {evaluate}"]
    if index == 0:
        return run
    return ["ascend-engine", "wait-for-master", "--addr=$(MASTER_ADDR)", "--port=$(MASTER_PORT)",
            f"--timeout={spec.masterWaitSeconds}", "--", *run]

def rank_order(spec: AscendTrainJobSpec) -> tuple[list[str], str | None, int] | None:
    """(levels, tensor-parallel level, pods per tensor-parallel group) when NODE_RANK follows the placement
    (spec.topology, the engine's launcher), else None: pod i is NODE_RANK i. A trainer command reads NODE_RANK
    as the kubelet expands it at start, before the placement is known, so its ranks stay the pods' indices."""
    if spec.topology is None or spec.trainer is not None:
        return None
    return list(spec.topology.levels), spec.topology.tensorParallel, spec.tensor_parallel_pods()


def rank_after_placement(env: list[dict[str, Any]], spec: AscendTrainJobSpec, index: int) -> list[dict[str, Any]]:
    """A pod other than 0 whose NODE_RANK the operator writes once the gang is placed: NODE_RANK and PET_NODE_RANK
    from its annotation (empty until then), the launcher told to wait for it (``ascend_engine.node_rank``), and the
    pod's own index, which its failure reports name (its NODE_RANK no longer is)."""
    from_annotation = {"valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{NODE_RANK_ANNOTATION}']"}}}
    out = [{"name": e["name"], **from_annotation} if e["name"] in ("NODE_RANK", "PET_NODE_RANK") else e for e in env]
    return out + env_list({NODE_RANK_WAIT_ENV: NODE_RANK_ANNOTATION, NODE_RANK_TIMEOUT_ENV: str(spec.masterWaitSeconds),
                           POD_INDEX_ENV: str(index)})


def pod(name: str, namespace: str, spec: AscendTrainJobSpec, index: int) -> dict[str, Any]:
    labels = job_labels(KIND, name) | {LABEL_REPLICA_INDEX: str(index)}
    if spec.devices.is_ascend() and spec.devices.ringController:
        labels["ring-controller.atlas"] = spec.devices.ringController
    device = spec.devices.extended_resource()
    limits = {device: str(spec.nprocPerNode)} if device else {}
    env = env_list(torchrun_env(name, namespace, spec, index)) + [POD_IP_ENV]
    if index > 0 and rank_order(spec) is not None:
        env = rank_after_placement(env, spec, index)
    if spec.trainer:
        env.append(metrics_port_env(spec.trainer.metricsPort))
    main = container(spec, command(name, spec, index), env, limits, processes=spec.nprocPerNode)
    with_tracker_credentials(main, name, namespace, spec)
    if spec.trainer and spec.trainer.workingDir:
        main["workingDir"] = spec.trainer.workingDir
    if not spec.trainer:
        with_annotations_file(main)
    body = pod_spec(spec, name, main)
    if not spec.trainer:
        body["volumes"].append({"name": PODINFO_VOLUME, "downwardAPI": {"items": [
            {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]}})
    body.update({"hostname": f"{name}-{index}", "subdomain": name})
    if spec.hostNetwork:
        body.update({"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"})
    out = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{name}-{index}", "labels": labels},
        "spec": body,
    }
    if topology := kueue_topology.annotations(spec):  # Kueue's topology request (kept only for a TAS admission)
        out["metadata"]["annotations"] = topology
    gang.mark_pod(out, name, spec)
    return out

def with_tracker_credentials(main: dict[str, Any], name: str, namespace: str, spec: AscendTrainJobSpec) -> None:
    """Experiment trackers (train.observability.trackers): each one's ``credentialsSecret`` becomes the pod's
    environment (``envFrom``: WANDB_API_KEY, MLFLOW_TRACKING_TOKEN, ... as the Secret's keys), so no credential is
    ever in the spec or the ConfigMap; the job's name and namespace name the tracker run."""
    trackers = spec.train.observability.trackers if spec.train else []
    if not trackers:
        return
    main["env"] += env_list({JOB_NAME_ENV: name, JOB_NAMESPACE_ENV: namespace})
    secrets = dict.fromkeys(t.credentialsSecret for t in trackers if t.credentialsSecret)
    if secrets:
        main["envFrom"] = list(main.get("envFrom", [])) + [{"secretRef": {"name": s}} for s in secrets]

def with_annotations_file(main: dict[str, Any]) -> None:
    """The pod's annotations as a file the engine watches (kubelet-refreshed downwardAPI volume): how the
    operator asks every rank for its stacks when the job stalls, without pods/exec (ascend_engine.stacks)."""
    main["volumeMounts"].append({"name": PODINFO_VOLUME, "mountPath": PODINFO_MOUNT, "readOnly": True})
    main["env"].append({"name": ANNOTATIONS_FILE_ENV, "value": f"{PODINFO_MOUNT}/annotations"})

def objects(name: str, namespace: str, spec: AscendTrainJobSpec) -> list[dict[str, Any]]:
    """Everything one job needs, in creation order (the ConfigMap and PodGroup before the pods)."""
    group = gang.pod_group(KIND, name, spec)
    return ([service(name), engine_config_map(name, spec)] + ([group] if group else [])
            + [pod(name, namespace, spec, i) for i in range(spec.nnodes)])
