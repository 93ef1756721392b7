"""A job's spec cannot change once the job exists, except ``runPolicy`` (suspend, deadlines, TTL, restarts),
as a Kubernetes Job's pod template cannot: pods already running, a finished job's outputs and the jobs that
depend on them were made from the old spec, so a changed spec would either do nothing (and ``kubectl apply``
would still answer ``configured``) or silently mix two specs in one run. The API server refuses the change with
the field named and how to rerun.

One CEL transition rule per top-level spec field (so the error names the field that changed): it holds when the
field is absent from both the old and the new spec, or present in both with equal values.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel

MUTABLE = ("runPolicy",)
MESSAGE = ("may not change once the job exists (only spec.runPolicy may); to run a changed spec, delete the job "
           "and create it again: kubectl replace --force -f FILE, or kubectl delete and then kubectl apply")


def spec_immutable_rules(spec_model: type[BaseModel]) -> list[dict[str, Any]]:
    rules = []
    for field, info in spec_model.model_fields.items():
        name = info.alias or field
        if name in MUTABLE:
            continue
        rules.append({"rule": f"has(self.{name}) == has(oldSelf.{name}) && "
                              f"(!has(self.{name}) || self.{name} == oldSelf.{name})",
                      "message": MESSAGE, "fieldPath": f".{name}", "reason": "FieldValueForbidden"})
    return rules
