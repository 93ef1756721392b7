"""Kubernetes-side pieces shared by every kind: the pod template knobs, conditions and status blocks.

Large upstream structures (tolerations, affinity, volumes) are passed through as they are written in a
Pod spec; the CRD marks them ``x-kubernetes-preserve-unknown-fields`` instead of copying the upstream schema.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from ascend_engine.config.base import not_null

from .admission import RESERVED_ENV_MESSAGE, RESERVED_ENV_RULE, reserved_env

# A field whose value is an upstream Kubernetes structure, kept verbatim.
Passthrough = Field(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})

# Bounds on what the CRDs' CEL rules compare (a changed spec is refused field by field, api/immutability.py):
# kube-apiserver estimates a rule's worst-case cost from maxLength / maxItems, and takes an unbounded one as large
# as the 3 MiB request allows, which can push a CRD over its cost budget. Kubernetes' own limits where it has
# one (object names), generous ones elsewhere.
NAME_MAX = 253  # a DNS subdomain: any object name
IMAGE_MAX = 1024
QUANTITY_MAX = 64
POD_LIST_MAX = 256  # env, envFrom, tolerations, volumes, mounts, pull secrets
ENV_NAME_MAX = 1024
ENV_VALUE_MAX = 1 << 20  # a ConfigMap's own limit
# apimachinery's IsDNS1123Subdomain: what kube-apiserver requires of every name these fields refer to (service
# accounts, priority classes, schedulers, Secrets, queues, our own kinds), so a wrong one fails at apply, not in
# the pod.
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ObjectName = Annotated[str, Field(max_length=NAME_MAX, pattern=DNS1123_SUBDOMAIN)]
# resource.Quantity's syntax as controller-gen writes it into CRDs, without the sign: requests, limits and
# sizes are never negative (kube-apiserver refuses a negative one in the pod, after the job exists).
QUANTITY_PATTERN = (r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)"
                    r"|(\.[0-9]+))))?$")
Quantity = Annotated[str, Field(max_length=QUANTITY_MAX, pattern=QUANTITY_PATTERN)]
# An image reference as the container runtime parses it (distribution/reference's ReferenceRegexp: optional
# registry host[:port]/, lower-case path components, optional :tag and @digest); the kubelet refuses anything else
# with InvalidImageName after the pods exist, kube-apiserver only refuses surrounding whitespace.
_PATH_COMPONENT = r"[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*"
_DOMAIN = (r"(([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(\.([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*"
           r"|\[[a-fA-F0-9:]+\])(:[0-9]+)?")
IMAGE_PATTERN = (rf"^({_DOMAIN}/)?{_PATH_COMPONENT}(/{_PATH_COMPONENT})*(:[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
                 r"(@[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$")
# kube-apiserver 1.32's environment variable names (RelaxedEnvironmentVariableValidation, on by default): printable
# ASCII but '='.
ENV_NAME_PATTERN = r"^[ -<>-~]+$"
# What reaches execve (env values, a command and its arguments): kube-apiserver takes a NUL byte, but no process
# can be started with one (runc refuses it), so the pods would fail with StartError on every restart.
NO_NUL_PATTERN = r"^[^\x00]*$"


def passthrough_list() -> Any:
    """An upstream structure's list, kept verbatim and bounded."""
    return Field(max_length=POD_LIST_MAX, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})


class KubeModel(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel,
                              use_attribute_docstrings=True)


VALUE_OR_VALUE_FROM_RULE = {
    "rule": "!has(self.valueFrom) || !has(self.value) || self.value == ''",
    "message": "may not have both value and valueFrom", "fieldPath": ".valueFrom", "reason": "FieldValueInvalid"}


class EnvVar(KubeModel):
    """An environment variable: a literal value, or valueFrom a Secret / ConfigMap key or a field of the pod."""

    model_config = KubeModel.model_config | {"json_schema_extra": {"x-kubernetes-validations": [
        VALUE_OR_VALUE_FROM_RULE]}}

    name: Annotated[str, Field(min_length=1, max_length=ENV_NAME_MAX, pattern=ENV_NAME_PATTERN)]
    """Variable name (printable ASCII but '=', as kube-apiserver 1.32 allows)."""
    value: Annotated[str, Field(max_length=ENV_VALUE_MAX, pattern=NO_NUL_PATTERN)] = ""
    """Value."""
    valueFrom: Annotated[dict[str, Any] | None, Field(min_length=1, max_length=1), Passthrough] = None
    """secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef, as in a Pod spec. The kubelet resolves it:
    a Secret's value never passes through the operator, its status, events or ConfigMaps."""

    @model_validator(mode="after")
    def _one_source(self) -> "EnvVar":
        if self.valueFrom and self.value:
            raise ValueError(VALUE_OR_VALUE_FROM_RULE["message"])
        return self

    def to_pod(self) -> dict[str, Any]:
        return {"name": self.name, "valueFrom": self.valueFrom} if self.valueFrom else \
            {"name": self.name, "value": self.value}


class ResourceList(KubeModel):
    """CPU and memory for the container (devices are requested from `devices`)."""

    requests: dict[str, Quantity] = {}
    """Requests, e.g. {cpu: "16", memory: 256Gi}."""
    limits: dict[str, Quantity] = {}
    """Limits."""


class RuntimeRef(KubeModel):
    """A training runtime whose pod settings the job starts from; what the job sets itself wins."""

    kind: Literal["AscendTrainingRuntime", "ClusterAscendTrainingRuntime"] = "ClusterAscendTrainingRuntime"
    """AscendTrainingRuntime (in the job's namespace) or ClusterAscendTrainingRuntime (cluster-wide)."""
    name: ObjectName
    """The runtime's name."""


class RuntimeSnapshot(KubeModel):
    """The runtime as the operator resolved it when it first saw the job: every later pod (restarts, resizes,
    resumes) is rendered from this copy, so editing or deleting the runtime never changes a job that exists."""

    kind: str
    """The runtime's kind."""
    name: str
    """The runtime's name."""
    generation: int | None = None
    """The runtime's metadata.generation when it was resolved."""
    hash: str = ""
    """sha256 (first 16 hex digits) of the template used, to compare with the runtime now."""
    template: Annotated[dict[str, Any], Passthrough] = {}
    """The runtime's template as it was used."""
    lockedFields: list[str] = []
    """The runtime's lockedFields then (checked when the job was resolved)."""


# A job that names a training runtime may leave the image (and every other pod setting) to it.
IMAGE_RULE = {"rule": "has(self.image) || has(self.runtimeRef)",
              "message": "image is required unless runtimeRef names a training runtime that sets it",
              "fieldPath": ".image", "reason": "FieldValueRequired"}


class PodSettings(KubeModel):
    """How each pod is run: image, resources, scheduling and storage."""

    model_config = KubeModel.model_config | {"json_schema_extra": {"x-kubernetes-validations": [IMAGE_RULE]}}

    image: Annotated[str | None, Field(min_length=1, max_length=IMAGE_MAX, pattern=IMAGE_PATTERN)] = None
    """Container image with ascend-engine (see the Dockerfile's engine-* targets); may come from runtimeRef."""
    runtimeRef: RuntimeRef | None = None
    """A training runtime (AscendTrainingRuntime or ClusterAscendTrainingRuntime) whose pod settings the job starts
    from; what the job sets wins (objects merged key by key, env by name, other lists replaced). Resolved once,
    when the operator first sees the job, and recorded in status.runtime (docs/runtimes.md)."""
    imagePullPolicy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """Image pull policy."""
    imagePullSecrets: Annotated[list[ObjectName], Field(max_length=POD_LIST_MAX)] = []
    """Names of Secrets to pull the image with."""
    env: Annotated[list[EnvVar], Field(max_length=POD_LIST_MAX, json_schema_extra={
        "x-kubernetes-validations": [RESERVED_ENV_RULE],
        # one entry per name: a second A would silently win over the first in the container
        "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})] = []
    """Extra environment variables (not torchrun's contract, which the operator sets)."""
    envFrom: Annotated[list[dict[str, Any]], passthrough_list()] = []
    """Variables from whole Secrets or ConfigMaps (secretRef / configMapRef, optional prefix), as in a Pod spec."""
    resources: ResourceList = ResourceList()
    """CPU and memory requests and limits. A CPU limit (else request) also sets OMP_NUM_THREADS to the cores per
    process, unless env sets it: torch would otherwise start a thread per core of the node in every process."""
    serviceAccountName: ObjectName | None = None
    """Service account of the pods."""
    schedulerName: ObjectName | None = None
    """Scheduler, e.g. volcano."""
    priorityClassName: ObjectName | None = None
    """Priority class."""
    nodeSelector: dict[str, str] = {}
    """Node selector."""
    tolerations: Annotated[list[dict[str, Any]], passthrough_list()] = []
    """Tolerations, as in a Pod spec."""
    affinity: Annotated[dict[str, Any], Passthrough] = {}
    """Affinity, as in a Pod spec."""
    volumes: Annotated[list[dict[str, Any]], passthrough_list()] = []
    """Volumes, as in a Pod spec (PVCs for data and checkpoints)."""
    volumeMounts: Annotated[list[dict[str, Any]], passthrough_list()] = []
    """Mounts of those volumes in the container."""
    shmSize: Annotated[str, Field(max_length=QUANTITY_MAX, pattern=f"^none$|{QUANTITY_PATTERN}"),
                       not_null("none to keep the runtime's 64Mi")] = "16Gi"
    """Size of the memory-backed /dev/shm (data loader workers need it); `none` keeps the runtime's 64Mi."""

    def shm_size_limit(self) -> str | None:
        """The memory-backed /dev/shm's size, None to keep the container runtime's own."""
        return None if self.shmSize == "none" else self.shmSize
    securityContext: Annotated[dict[str, Any], Passthrough] = {}
    """The engine container's securityContext, as in a Pod spec. Empty: allowPrivilegeEscalation false,
    capabilities drop ALL, seccomp RuntimeDefault. Set, it replaces that default as a whole (e.g. for an NPU
    driver that needs root: {runAsUser: 0, capabilities: {drop: [ALL]}}), with allowPrivilegeEscalation false
    unless stated. privileged, capabilities.add, allowPrivilegeEscalation: true and procMount: Unmasked are
    refused unless the operator's jobPodPolicy allows them."""
    podSecurityContext: Annotated[dict[str, Any], Passthrough] = {}
    """The pod's securityContext (runAsUser, fsGroup, supplementalGroups, ...). Empty: seccomp RuntimeDefault."""
    terminationGracePeriodSeconds: Annotated[int, Field(ge=30, le=86400)] = 900
    """Seconds between SIGTERM (drain, preemption) and SIGKILL: the engine finishes its step and saves a
    checkpoint in that time, so leave room for writing one to shared storage. torchrun is told to wait for its
    workers until 15 s before the end (TORCH_ELASTIC_SHUTDOWN_TIMEOUT)."""
    automountServiceAccountToken: bool = False
    """Mount the service account's API token in the pods; training needs no API access, so off by default."""

    @field_validator("env")
    @classmethod
    def _not_reserved(cls, env: list[EnvVar]) -> list[EnvVar]:
        name = reserved_env([e.name for e in env])
        if name:
            raise ValueError(f"env {name} {RESERVED_ENV_MESSAGE}")
        return env

    @model_validator(mode="after")
    def _image_or_runtime(self) -> "PodSettings":
        if self.image is None and self.runtimeRef is None:
            raise ValueError(IMAGE_RULE["message"])
        return self


class Condition(KubeModel):
    """A condition, as in Kubernetes' own objects."""

    type: str
    """Created, Running, Restarting, Succeeded, Failed, Suspended, Pending."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds."""
    reason: str = ""
    """Machine-readable reason in CamelCase."""
    message: str = ""
    """Human-readable detail."""
    lastTransitionTime: str | None = None
    """When status last changed (RFC 3339)."""


class ReplicaStatus(KubeModel):
    """Pods by state."""

    active: int = 0
    """Pods pending or running."""
    ready: int = 0
    """Pods running and ready."""
    succeeded: int = 0
    """Pods that exited 0."""
    failed: int = 0
    """Pods that failed."""


Phase = Literal["Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended"]


class AvoidedNode(KubeModel):
    """A node the job's pods are kept off, after a pod failed because of it."""

    node: str
    """The node's name (its kubernetes.io/hostname label)."""
    reason: Literal["NodeFault", "DeviceFault"]
    """NodeFault: the node went NotReady, unreachable or away under the pod; DeviceFault: the pod died of an
    accelerator error."""
    message: str = ""
    """What said so: the pod's DisruptionTarget condition, or the error line of its termination message."""
    time: str | None = None
    """When the restart that avoids it began (RFC 3339)."""


# A finished job stays finished, as a Job's Complete and Failed conditions do: its outputs and the jobs that depend
# on them were made by that run. (A job is run again by creating it again.)
FINAL_PHASE_RULE = {
    "rule": "!has(oldSelf.phase) || !(oldSelf.phase in ['Succeeded', 'Failed']) || "
            "(has(self.phase) && self.phase == oldSelf.phase)",
    "message": "a Succeeded or Failed job stays so; to run it again, delete the job and create it again "
               "(kubectl replace --force -f FILE)",
    "fieldPath": ".phase", "reason": "FieldValueForbidden"}


class JobStatusBase(KubeModel):
    """Status fields every kind shares."""

    model_config = KubeModel.model_config | {"json_schema_extra": {"x-kubernetes-validations": [FINAL_PHASE_RULE]}}

    phase: Phase | None = None
    """Pending, Running, Restarting, Succeeded, Failed or Suspended."""
    conditions: list[Condition] = []
    """Conditions with reasons and messages."""
    replicas: ReplicaStatus | None = None
    """Pods by state."""
    restarts: int = 0
    """Gang restarts so far."""
    disruptions: int = 0
    """Of those, restarts after the cluster preempted or evicted a pod (condition DisruptionTarget) or a pod's node
    or device failed (avoidedNodes): not counted against runPolicy.backoffLimit."""
    avoidedNodes: list[AvoidedNode] = []
    """Nodes where a pod failed because of the node or its device: later pods get a required node affinity
    (kubernetes.io/hostname NotIn) that keeps them off. Clear it (a status patch) once a node is repaired."""
    startTime: str | None = None
    """When the first pod started running."""
    completionTime: str | None = None
    """When the job succeeded or failed."""
    observedGeneration: int | None = None
    """The spec generation this status describes."""
    runtime: RuntimeSnapshot | None = None
    """The training runtime of spec.runtimeRef as resolved when the job was first seen; every pod is rendered from
    this copy, never from the live runtime."""
