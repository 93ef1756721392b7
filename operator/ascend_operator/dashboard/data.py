"""What the page shows, read from the Kubernetes API: every job's status and its history ConfigMap."""
from __future__ import annotations

from typing import Any

from kubernetes import client

from ..api.group import API_GROUP, API_VERSION, TRAIN_JOB
from ..history import LABEL, read


def snapshot(api: client.ApiClient) -> dict[str, Any]:
    """``{"jobs": [...]}``: name, namespace, phase, progress, the latest condition message and the series."""
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    jobs = custom.list_cluster_custom_object(API_GROUP, API_VERSION, TRAIN_JOB.plural)["items"]
    maps = api.sanitize_for_serialization(core.list_config_map_for_all_namespaces(label_selector=LABEL))["items"]
    series = {(m["metadata"]["namespace"], m["metadata"]["labels"][LABEL]): read(m) for m in maps}
    out = []
    for job in sorted(jobs, key=lambda j: j["metadata"].get("creationTimestamp", ""), reverse=True):
        meta, status = job["metadata"], job.get("status") or {}
        latest = max(status.get("conditions") or [{}], key=lambda c: c.get("lastTransitionTime") or "")
        if status.get("phase") == "Failed":  # the cause, as in kubectl's -o wide column
            latest = next((c for c in status["conditions"] if c.get("type") == "Failed"), latest)
        out.append({"name": meta["name"], "namespace": meta["namespace"], "phase": status.get("phase", "Pending"),
                    "progress": status.get("progress") or {}, "restarts": status.get("restarts", 0),
                    "message": latest.get("message", ""),
                    "series": series.get((meta["namespace"], meta["name"]), [])})
    return {"jobs": out}
