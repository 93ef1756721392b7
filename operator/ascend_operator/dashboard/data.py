"""What the page shows, read from the Kubernetes API: every training job's status, its history ConfigMap, and
the pipeline around it (the DatasetPrep and CheckpointConvert it names, the exports that name it)."""
from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from ..api.group import API_GROUP, API_VERSION, CHECKPOINT_CONVERT, DATASET_PREP, KINDS, TRAIN_JOB
from ..progress.history import LABEL, read


def object_path(plural: str, namespace: str, name: str) -> str:
    """The dashboard's link to one object (its JSON as the API server has it)."""
    return f"/api/objects/{plural}/{namespace}/{name}"


def get_object(api: client.ApiClient, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
    """One of our custom objects, or None when there is no such object (or the plural is not ours)."""
    if plural not in {k.plural for k in KINDS}:
        return None
    try:
        return client.CustomObjectsApi(api).get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, plural,
                                                                         name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def failure_cause(status: dict[str, Any]) -> str:
    """The Failed condition's message (the engine's error line once the operator has it), else the latest
    condition's."""
    conditions = status.get("conditions") or []
    failed = [c for c in conditions if c.get("type") == "Failed" and c.get("status") == "True"]
    chosen = failed[-1] if failed else max(conditions or [{}], key=lambda c: c.get("lastTransitionTime") or "")
    return chosen.get("message", "")


def _node(kind: str, plural: str, namespace: str, name: str, phase: str | None) -> dict[str, Any]:
    return {"kind": kind, "name": name, "phase": phase or "Missing", "link": object_path(plural, namespace, name)}


def _evaluation_phase(job: dict[str, Any]) -> str:
    status, spec = job.get("status") or {}, job.get("spec") or {}
    progress = status.get("progress") or {}
    trained = not spec.get("train") or (progress.get("iteration") or 0) >= (progress.get("trainIters") or 1)
    if status.get("evaluation"):
        return "Succeeded"
    if status.get("phase") == "Failed":
        return "Failed" if trained else "NotRun"
    if status.get("phase") == "Running" and trained:
        return "Running"
    return "Pending"


def pipeline(job: dict[str, Any], preps: dict, converts: dict) -> list[dict[str, Any]]:
    """DatasetPrep -> CheckpointConvert -> AscendTrainJob -> evaluation -> export, the parts this job has."""
    meta, spec = job["metadata"], job.get("spec") or {}
    namespace, name = meta["namespace"], meta["name"]

    def phase(objects: dict, ref: str) -> str | None:
        return ((objects.get((namespace, ref)) or {}).get("status") or {}).get("phase")

    nodes = []
    if spec.get("datasetPrepRef"):
        ref = spec["datasetPrepRef"]
        nodes.append(_node(DATASET_PREP.kind, DATASET_PREP.plural, namespace, ref, phase(preps, ref)))
    if spec.get("checkpointConvertRef"):
        ref = spec["checkpointConvertRef"]
        nodes.append(_node(CHECKPOINT_CONVERT.kind, CHECKPOINT_CONVERT.plural, namespace, ref, phase(converts, ref)))
    nodes.append(_node(TRAIN_JOB.kind, TRAIN_JOB.plural, namespace, name,
                       (job.get("status") or {}).get("phase") or "Pending"))
    if spec.get("evaluation"):
        nodes.append({**_node("evaluation", TRAIN_JOB.plural, namespace, name, _evaluation_phase(job)),
                      "name": "evaluation"})
    for (ns, export), obj in sorted(converts.items()):
        if ns == namespace and (obj.get("spec") or {}).get("trainJobRef") == name:
            nodes.append(_node(CHECKPOINT_CONVERT.kind, CHECKPOINT_CONVERT.plural, namespace, export,
                               (obj.get("status") or {}).get("phase") or "Pending"))
    return nodes


def snapshot(api: client.ApiClient) -> dict[str, Any]:
    """``{"jobs": [...]}``: each job's phase, progress, failure cause, evaluation, pipeline and series."""
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)

    def every(kind) -> list[dict[str, Any]]:
        return custom.list_cluster_custom_object(API_GROUP, API_VERSION, kind.plural)["items"]

    def by_name(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
        return {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objects}

    jobs = every(TRAIN_JOB)
    preps, converts = by_name(every(DATASET_PREP)), by_name(every(CHECKPOINT_CONVERT))
    maps = api.sanitize_for_serialization(core.list_config_map_for_all_namespaces(label_selector=LABEL))["items"]
    series = {(m["metadata"]["namespace"], m["metadata"]["labels"][LABEL]): read(m) for m in maps}
    out = []
    for job in sorted(jobs, key=lambda j: j["metadata"].get("creationTimestamp", ""), reverse=True):
        meta, status = job["metadata"], job.get("status") or {}
        out.append({"name": meta["name"], "namespace": meta["namespace"], "phase": status.get("phase", "Pending"),
                    "link": object_path(TRAIN_JOB.plural, meta["namespace"], meta["name"]),
                    "progress": status.get("progress") or {}, "restarts": status.get("restarts", 0),
                    "message": failure_cause(status), "evaluation": status.get("evaluation"),
                    "recoveries": status.get("recoveries") or [], "goodput": status.get("goodput"),
                    "tracking": status.get("tracking") or [],
                    "pipeline": pipeline(job, preps, converts),
                    "series": series.get((meta["namespace"], meta["name"]), [])})
    return {"jobs": out}
