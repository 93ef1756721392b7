"""Drive training jobs from Python (a notebook, a pipeline step): ``TrainClient``.

    from ascend_operator.sdk import TrainClient
    client = TrainClient()                                  # the kubeconfig's current context
    client.create(manifest_or_spec, name="llm")             # validated first: the same messages as `ascend-train validate`
    client.wait("llm", "Succeeded", timeout=3600)
    for line in client.logs("llm", follow=True): print(line)
    pandas.DataFrame(client.history("llm"))                 # iteration, loss, learningRate, tokensPerSecond, ...

It speaks to the Kubernetes API through the official client, so any cluster in the kubeconfig works, and the
embedded local cluster too (``TrainClient.local()``: its kubeconfig under ``.local-cluster/``). Every kind of the
API group is handled (AscendTrainJob by default; ``kind="DatasetPrep"`` / ``"CheckpointConvert"``). See docs/sdk.md.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException
from pydantic import BaseModel

from .progress import history
from .api.group import (API_GROUP, API_VERSION, KINDS, LABEL_ATTEMPT, LABEL_JOB_KIND, LABEL_JOB_NAME,
                        LABEL_REPLICA_INDEX, TRAIN_JOB, Kind)
from .validation import Problem, validate_text

TERMINAL = ("Succeeded", "Failed")


class InvalidSpec(ValueError):
    """The resource would be refused: every problem, as ``ascend-train validate`` prints them."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in sorted(problems, key=lambda p: (p.line or 0, p.field))))


class JobFailed(RuntimeError):
    """``wait`` saw the job end in a phase it was not waiting for; ``job`` holds its last state."""

    def __init__(self, job: "Job"):
        self.job = job
        super().__init__(f"{job.kind} {job.namespace}/{job.name} is {job.phase}: {job.message}")


@dataclass
class Job:
    """One object's state as the operator reports it."""

    kind: str
    name: str
    namespace: str
    phase: str | None
    progress: dict[str, Any] = field(default_factory=dict)
    restarts: int = 0
    conditions: list[dict[str, Any]] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def message(self) -> str:
        """The newest condition's message (a Failed job's cause)."""
        latest = max(self.conditions, key=lambda c: c.get("lastTransitionTime") or "", default={})
        return latest.get("message", "")

    @classmethod
    def of(cls, obj: dict[str, Any]) -> "Job":
        status = obj.get("status") or {}
        return cls(obj["kind"], obj["metadata"]["name"], obj["metadata"]["namespace"], status.get("phase"),
                   dict(status.get("progress") or {}), status.get("restarts", 0), list(status.get("conditions") or []),
                   obj)


def _kind(name: str) -> Kind:
    for k in KINDS:
        if name.lower() in (k.kind.lower(), k.plural, k.singular, k.short):
            return k
    raise ValueError(f"unknown kind {name!r}: one of {', '.join(k.kind for k in KINDS)}")


class TrainClient:
    def __init__(self, kubeconfig: str | Path | None = None, context: str | None = None,
                 namespace: str = "default"):
        """``kubeconfig``: a file (default: $KUBECONFIG or ~/.kube/config, or the in-cluster service account when
        neither exists); ``context``: one of its contexts (default: the current one)."""
        self.namespace = namespace
        try:
            self.api = k8s_config.new_client_from_config(str(kubeconfig) if kubeconfig else None, context)
        except k8s_config.ConfigException:
            if kubeconfig or context:
                raise
            k8s_config.load_incluster_config()
            self.api = k8s.ApiClient()
        self.custom = k8s.CustomObjectsApi(self.api)
        self.core = k8s.CoreV1Api(self.api)

    @classmethod
    def local(cls, root: str | Path = ".local-cluster", namespace: str = "default") -> "TrainClient":
        """The embedded local cluster started with ``ascend-train local up --root ROOT``."""
        kubeconfig = Path(root) / "kubeconfig"
        if not kubeconfig.exists():
            raise FileNotFoundError(f"no local cluster under {root}/ (start one with `ascend-train local up`)")
        return cls(kubeconfig, namespace=namespace)

    def close(self) -> None:
        self.api.close()

    def __enter__(self) -> "TrainClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- create, read --------------------------------------------------------------------------------------------

    def manifest(self, resource: dict[str, Any] | BaseModel, name: str | None = None,
                 namespace: str | None = None, kind: str = TRAIN_JOB.kind) -> dict[str, Any]:
        """A whole manifest from a manifest dict, a spec dict or a spec model (AscendTrainJobSpec, ...)."""
        if isinstance(resource, BaseModel):
            resource = {"spec": resource.model_dump(mode="json", by_alias=True, exclude_unset=True)}
        elif "spec" not in resource:
            resource = {"spec": resource}
        k = _kind(resource.get("kind") or kind)
        metadata = dict(resource.get("metadata") or {})
        if name:
            metadata["name"] = name
        metadata["namespace"] = namespace or metadata.get("namespace") or self.namespace
        return {**resource, "apiVersion": resource.get("apiVersion") or k.api_version, "kind": k.kind,
                "metadata": metadata}

    def validate(self, manifest: dict[str, Any]) -> None:
        """Raise InvalidSpec with every problem (the CRD's schema and CEL rules, then the spec model)."""
        source = f"{manifest.get('kind')}/{(manifest.get('metadata') or {}).get('name', '?')}"
        _, problems = validate_text(yaml.safe_dump(manifest, sort_keys=False), source)
        if problems:
            raise InvalidSpec(problems)

    def create(self, resource: dict[str, Any] | BaseModel, name: str | None = None, namespace: str | None = None,
               kind: str = TRAIN_JOB.kind) -> Job:
        """Validate, then create; nothing is sent when the resource is invalid."""
        manifest = self.manifest(resource, name, namespace, kind)
        self.validate(manifest)
        k = _kind(manifest["kind"])
        obj = self.custom.create_namespaced_custom_object(API_GROUP, API_VERSION, manifest["metadata"]["namespace"],
                                                          k.plural, manifest)
        return Job.of(obj)

    def get(self, name: str, namespace: str | None = None, kind: str = TRAIN_JOB.kind) -> Job:
        k = _kind(kind)
        return Job.of(self.custom.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace or self.namespace,
                                                               k.plural, name))

    def list(self, namespace: str | None = None, kind: str = TRAIN_JOB.kind) -> list[Job]:
        k = _kind(kind)
        items = self.custom.list_namespaced_custom_object(API_GROUP, API_VERSION, namespace or self.namespace,
                                                          k.plural)["items"]
        return [Job.of({**o, "kind": k.kind}) for o in items]

    def wait(self, name: str, phase: str | tuple[str, ...] = "Succeeded", timeout: float = 3600.0,
             namespace: str | None = None, kind: str = TRAIN_JOB.kind, poll: float = 1.0) -> Job:
        """Until the job is in ``phase`` (one or several); JobFailed when it ends elsewhere first, TimeoutError
        when ``timeout`` seconds pass."""
        wanted = (phase,) if isinstance(phase, str) else tuple(phase)
        deadline = time.monotonic() + timeout
        while True:
            job = self.get(name, namespace, kind)
            if job.phase in wanted:
                return job
            if job.phase in TERMINAL:
                raise JobFailed(job)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{kind} {job.namespace}/{name} still {job.phase} after {timeout:g}s "
                                   f"(waiting for {' or '.join(wanted)})")
            time.sleep(poll)

    # -- logs and history ----------------------------------------------------------------------------------------

    def pod_name(self, name: str, index: int = 0, attempt: int | None = None, namespace: str | None = None,
                 kind: str = TRAIN_JOB.kind) -> str:
        """The pod of replica ``index`` in ``attempt`` (default: the newest attempt that has one): pods are named
        ``<name>-<index>-<attempt>`` and a gang restart keeps the failed attempt's pods (see docs/architecture.md)."""
        selector = {LABEL_JOB_NAME: name, LABEL_JOB_KIND: _kind(kind).kind, LABEL_REPLICA_INDEX: str(index)}
        if attempt is not None:
            selector[LABEL_ATTEMPT] = str(attempt)
        pods = self.core.list_namespaced_pod(namespace or self.namespace,
                                             label_selector=",".join(f"{k}={v}" for k, v in selector.items())).items
        if not pods:
            which = f"attempt {attempt}" if attempt is not None else "any attempt"
            raise LookupError(f"{kind} {namespace or self.namespace}/{name} has no pod of index {index} in {which}")
        return max(pods, key=lambda p: int((p.metadata.labels or {}).get(LABEL_ATTEMPT, 0))).metadata.name

    def logs(self, name: str, index: int = 0, follow: bool = False, namespace: str | None = None,
             kind: str = TRAIN_JOB.kind, tail_lines: int | None = None, attempt: int | None = None) -> Iterator[str]:
        """The lines of the pod of replica ``index`` (a DatasetPrep's or CheckpointConvert's only pod is index 0)
        in ``attempt`` (default: the newest); ``follow`` streams until the container ends."""
        pod = self.pod_name(name, index, attempt, namespace, kind)
        response = self.core.read_namespaced_pod_log(pod, namespace or self.namespace, follow=follow,
                                                     tail_lines=tail_lines, _preload_content=False)
        pending = b""
        try:
            for chunk in response.stream(4096):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line.decode(errors="replace")
            if pending:
                yield pending.decode(errors="replace")
        finally:
            response.release_conn()

    def history(self, name: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """The kept figures of a training job, one row per recorded iteration (iteration, time, loss,
        learningRate, tokensPerSecond, and the stage's own figures): ``pandas.DataFrame(rows)``."""
        try:
            cm = self.core.read_namespaced_config_map(history.config_map_name(name), namespace or self.namespace)
        except ApiException as e:
            if e.status == 404:
                return []
            raise
        return history.read({"data": cm.data})

    # -- suspend, resume, delete ---------------------------------------------------------------------------------

    def _run_policy(self, name: str, namespace: str | None, kind: str, suspend: bool) -> Job:
        k = _kind(kind)
        obj = self.custom.patch_namespaced_custom_object(API_GROUP, API_VERSION, namespace or self.namespace,
                                                         k.plural, name, {"spec": {"runPolicy": {"suspend": suspend}}})
        return Job.of(obj)

    def suspend(self, name: str, namespace: str | None = None, kind: str = TRAIN_JOB.kind) -> Job:
        """Delete the pods and keep the job (runPolicy.suspend: true); ``resume`` recreates them."""
        return self._run_policy(name, namespace, kind, True)

    def resume(self, name: str, namespace: str | None = None, kind: str = TRAIN_JOB.kind) -> Job:
        return self._run_policy(name, namespace, kind, False)

    def delete(self, name: str, namespace: str | None = None, kind: str = TRAIN_JOB.kind) -> None:
        """Delete the job; what it created goes with it (owner references)."""
        self.custom.delete_namespaced_custom_object(API_GROUP, API_VERSION, namespace or self.namespace,
                                                    _kind(kind).plural, name)
