"""``train.observability.trackers``: the experiment trackers rank 0 logs to (MLflow, Weights & Biases, SwanLab).

Credentials never appear here: a tracker names a Secret (``credentialsSecret``) whose keys the operator puts in
the pods' environment, under the names the tracker's own client reads (``MLFLOW_TRACKING_TOKEN``,
``WANDB_API_KEY``, ``SWANLAB_API_KEY``). The engine's side is ``ascend_engine/train/trackers``.
"""
from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field, model_validator

from .base import EngineModel

TrackerType = Literal["mlflow", "wandb", "swanlab"]
# The pip package each tracker needs (named in the error when it is missing).
TRACKER_PACKAGES = {"mlflow": "mlflow", "wandb": "wandb", "swanlab": "swanlab"}
# The environment variables a tracker's client reads its credentials from: what the credentialsSecret holds.
CREDENTIAL_ENV = {"mlflow": ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"),
                  "wandb": ("WANDB_API_KEY",), "swanlab": ("SWANLAB_API_KEY",)}
DEFAULT_PROJECT = "ascend-train"
# Set by the operator in a job's pods that name trackers: the default run name, and system info.
JOB_NAME_ENV, JOB_NAMESPACE_ENV = "ASCEND_JOB_NAME", "ASCEND_JOB_NAMESPACE"
SECRET_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"  # a Kubernetes object name (DNS subdomain)


# The same checks as TrackerConfig's validator, as CEL on each list item, so kubectl apply refuses them too.
CEL_RULES = [
    {"rule": "self.type != 'mlflow' || has(self.trackingUri)",
     "message": "trackers: mlflow needs trackingUri (http://mlflow.example:5000, file:///shared/mlruns)"},
    {"rule": "self.type == 'mlflow' || (!has(self.trackingUri) && !has(self.experiment))",
     "message": "trackers: trackingUri and experiment apply to mlflow"},
    {"rule": "self.type != 'mlflow' || (!has(self.project) && !has(self.dir))",
     "message": "trackers: project and dir apply to wandb or swanlab"},
    {"rule": "self.type != 'mlflow' || !has(self.mode) || self.mode == 'online'",
     "message": "trackers: mlflow has no offline mode here; log to a file:// trackingUri on a shared volume instead"},
    {"rule": "self.type != 'wandb' || !has(self.mode) || self.mode != 'local'",
     "message": "trackers: wandb mode is online or offline (local is swanlab's)"},
]
# A list keyed by type: the API server refuses a tracker named twice, and merges by type on apply.
LIST_SCHEMA = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}


class TrackerConfig(EngineModel):
    """One experiment tracker. Rank 0 logs the metrics endpoint's series (loss, learningRate, tokensPerSecond, mfu,
    validationLoss, the stage's own figures) at each logged iteration, the resolved engine config, system info and
    the job's evaluation results; a resumed or restarted job continues the same tracker run (its id is kept in
    ``ascend_trackers.json`` beside the checkpoints)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": CEL_RULES})

    type: TrackerType
    """mlflow, wandb (Weights & Biases) or swanlab; each at most once."""
    trackingUri: str | None = None
    """mlflow: the tracking server (http(s)://host:port), or a local store (file:///shared/mlruns, sqlite:///...)."""
    experiment: str | None = None
    """mlflow: the experiment's name (created when missing; default ascend-train)."""
    project: str | None = None
    """wandb / swanlab: the project (default ascend-train)."""
    entity: str | None = None
    """wandb: the entity (team or user); swanlab: the workspace (organisation). Default: the key's own."""
    runName: str | None = None
    """The run's display name (default: the job's name)."""
    mode: Literal["online", "offline", "local"] = "online"
    """online: log to the service as training runs. offline (wandb, swanlab): write the run under dir only, to
    upload later (``wandb sync <dir>/wandb/offline-run-*``, ``swanlab sync``), for clusters without a way out.
    local (swanlab): keep the run on disk for ``swanlab watch``. mlflow is always online (a file:// trackingUri is
    its offline store)."""
    dir: str | None = None
    """wandb / swanlab: where the run's files go (offline runs wait here to be synced; put it on a shared volume).
    Default: ``<checkpoint.save>/<type>``, else the working directory."""
    credentialsSecret: Annotated[str | None, Field(pattern=SECRET_NAME)] = None
    """A Secret in the job's namespace whose keys become the pods' environment (envFrom): MLFLOW_TRACKING_TOKEN (or
    MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD), WANDB_API_KEY, SWANLAB_API_KEY. Credentials never go in
    the spec."""

    @model_validator(mode="after")
    def _fields_of_its_type(self) -> "TrackerConfig":
        t = self.type
        only = {"trackingUri": "mlflow", "experiment": "mlflow", "project": "wandb or swanlab",
                "dir": "wandb or swanlab"}
        for name, owner in only.items():
            if getattr(self, name) is not None and t not in owner.split(" or "):
                raise ValueError(f"trackers: {name} applies to {owner}, not {t}")
        if t == "mlflow":
            if not self.trackingUri:
                raise ValueError("trackers: mlflow needs trackingUri (http://mlflow.example:5000, file:///shared/mlruns)")
            if urlsplit(self.trackingUri).password is not None:
                raise ValueError("trackers: mlflow trackingUri holds a password; name a Secret in credentialsSecret "
                                 "with MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD instead")
            if self.mode != "online":
                raise ValueError("trackers: mlflow has no offline mode here; log to a file:// trackingUri on a shared "
                                 "volume instead")
        if t == "wandb" and self.mode == "local":
            raise ValueError("trackers: wandb mode is online or offline (local is swanlab's)")
        return self

    def key(self) -> str:
        """What makes a tracker the same one across restarts (its run is continued only where this matches)."""
        where = self.trackingUri if self.type == "mlflow" else self.project or DEFAULT_PROJECT
        name = self.experiment if self.type == "mlflow" else self.entity
        return f"{self.type}|{where}|{name or DEFAULT_PROJECT}"


def check_trackers(trackers: list[TrackerConfig]) -> None:
    seen = [t.type for t in trackers]
    twice = sorted({t for t in seen if seen.count(t) > 1})
    if twice:
        raise ValueError(f"observability.trackers names {', '.join(twice)} more than once (one run per tracker)")

