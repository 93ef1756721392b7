"""Helpers the handlers of every kind share: one API client, spec validation with a named field (and, for an
AscendTrainJob, its memory plan against the device's memory)."""
from __future__ import annotations

from functools import lru_cache
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ascend_engine.config.loader import format_validation_error

from .. import plan
from ..api.group import TRAIN_JOB
from ..kubeclient import Kube
from ..object_cache import JOBS
from . import pod_policy
from ..status import now, set_condition

M = TypeVar("M", bound=BaseModel)


@lru_cache(maxsize=1)
def kube() -> Kube:
    return Kube()


def parse_spec(model: type[M], kind: str, namespace: str, name: str, spec: dict[str, Any],
               body: Any) -> M | None:
    """The spec as the engine will see it, or None after marking the job Failed with the field named (an invalid
    spec, or one the operator's pod policy refuses)."""
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
    too_big = plan.refusal(plan.job_plan(parsed)) if kind == TRAIN_JOB.kind else None
    if too_big:  # before any pod exists: the layout cannot fit the device (docs/plan.md)
        _fail(kind, namespace, name, body, plan.REFUSED, f"{kind} {namespace}/{name}: {too_big}")
        return None
    return parsed


def _fail(kind: str, namespace: str, name: str, body: Any, reason: str, message: str) -> None:
    at = now()
    conditions = set_condition([], "Failed", "True", reason, message, at)
    JOBS.observe((kind, namespace, name), kube().patch_status(kind, namespace, name, {
        "phase": "Failed", "conditions": conditions, "completionTime": at}))
    kube().post_event(body, reason, message, warning=True)
