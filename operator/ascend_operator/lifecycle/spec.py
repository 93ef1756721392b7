"""Helpers the handlers of every kind share: one API client, spec validation with a named field (and, for an
AscendTrainJob, its memory plan against the device's memory)."""
from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ascend_engine.config.loader import format_validation_error

from ..kinds import plan, runtimes
from ..api.group import TRAIN_JOB
from ..client.kubeclient import kube
from ..cache.object_cache import JOBS
from ..kinds import pod_policy
from . import kstatus
from .status import now, set_condition

M = TypeVar("M", bound=BaseModel)


def parse_spec(model: type[M], kind: str, namespace: str, name: str, spec: dict[str, Any],
               body: Any) -> M | None:
    """The spec as the engine will see it, or None after marking the job Failed with the field named (an invalid
    spec, or one the operator's pod policy refuses). A job naming a training runtime is merged over it first
    (``runtimes.resolve``: the copy in status.runtime once recorded, else the live runtime, recorded now)."""
    recorded = None
    if spec.get("runtimeRef"):
        try:
            spec, recorded = runtimes.resolve(spec, (body.get("status") or {}).get("runtime"), namespace,
                                              kube().get_runtime, model)
        except runtimes.Refused as e:
            _fail(kind, namespace, name, body, e.reason, f"{kind} {namespace}/{name}: {e}")
            return None
    try:
        parsed = model.model_validate(dict(spec))
    except ValidationError as e:
        _fail(kind, namespace, name, body, "InvalidSpec",
              format_validation_error(e, f"{kind} {namespace}/{name}", prefix=("spec",)))
        return None
    refused = pod_policy.denied(parsed)
    if refused:
        _fail(kind, namespace, name, body, "PolicyViolation", f"{kind} {namespace}/{name}: {refused}")
        return None
    estimate = plan.job_plan(parsed) if kind == TRAIN_JOB.kind else None
    if too_big := plan.refusal(estimate):  # before any pod exists: the layout cannot fit the device (docs/plan.md)
        _fail(kind, namespace, name, body, plan.REFUSED, f"{kind} {namespace}/{name}: {too_big}",
              {"plan": estimate.status()})  # the figures it was refused on
        return None
    if recorded is not None:
        _record_runtime(kind, namespace, name, body, recorded)
    return parsed


def _record_runtime(kind: str, namespace: str, name: str, body: Any, recorded: dict[str, Any]) -> None:
    """status.runtime, written at once: every later reconcile renders from it. The job object in hand takes the
    new resourceVersion, so the reconcile's own status write (a merge patch, which keeps status.runtime) does not
    conflict with this one."""
    stored = kube().patch_status(kind, namespace, name, {"runtime": recorded})
    JOBS.observe((kind, namespace, name), stored)
    body.setdefault("metadata", {})["resourceVersion"] = stored["metadata"].get("resourceVersion")
    body.setdefault("status", {})["runtime"] = recorded
    kube().post_event(body, "RuntimeResolved",
                      f"pod settings from {recorded['kind']} {recorded['name']} (generation {recorded['generation']}, "
                      f"template {recorded['hash']}); later changes to it do not apply to this job")


def _fail(kind: str, namespace: str, name: str, body: Any, reason: str, message: str,
          extra: dict[str, Any] | None = None) -> None:
    at = now()
    conditions = set_condition([], "Failed", "True", reason, message, at)
    conditions = kstatus.conditions({"phase": "Failed", "conditions": conditions}, at)["conditions"]  # Stalled=True
    JOBS.observe((kind, namespace, name), kube().patch_status(kind, namespace, name, {
        "phase": "Failed", "conditions": conditions, "completionTime": at,
        "observedGeneration": (body.get("metadata") or {}).get("generation"), **(extra or {})}))
    kube().post_event(body, reason, message, warning=True)
