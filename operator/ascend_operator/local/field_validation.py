"""Server-side field validation (the ``fieldValidation`` query parameter of create, update and patch).

As on kube-apiserver (1.27+): ``Strict`` answers 400 BadRequest ``strict decoding error: unknown field "spec.x"``
before the object is validated, ``Warn`` (the default when the parameter is absent) stores the pruned object
and answers with one ``Warning: 299`` header per unknown field, ``Ignore`` prunes silently. Unknown fields are
the ones the CRD's structural schema prunes, or for built-in kinds (and every custom object's metadata, which is
ObjectMeta) the ones Kubernetes' own OpenAPI schema does not know (``core_schemas``). Differs from a real API
server: duplicate fields in a JSON body are not detected.

The directive travels with the request in a context variable (each aiohttp request runs in its own task), so the
object store's write path needs no extra parameter.
"""
from __future__ import annotations

import contextvars
import json
from dataclasses import dataclass, field
from typing import Any

DIRECTIVES = ("Strict", "Warn", "Ignore")


@dataclass
class RequestFields:
    directive: str = "Warn"
    warnings: list[str] = field(default_factory=list)


_current: contextvars.ContextVar[RequestFields | None] = contextvars.ContextVar("field_validation", default=None)


class FieldValidationError(Exception):
    """Answered as 400 BadRequest: unknown fields under Strict, or an unsupported directive."""


class StrictDecodingError(FieldValidationError):
    """Unknown fields under fieldValidation=Strict."""

    def __init__(self, kind: str, version: str, unknown: list[str]):
        fields = ", ".join(f'unknown field "{f}"' for f in unknown)
        super().__init__(f'{kind} in version "{version}" cannot be handled as a {kind}: strict decoding error: '
                         f"{fields}")


def begin(query: Any) -> RequestFields:
    """The directive of this request; a value other than Strict, Warn or Ignore is a FieldValidationError."""
    directive = query.get("fieldValidation") or "Warn"
    if directive not in DIRECTIVES:
        raise FieldValidationError(f'fieldValidation: Unsupported value: "{directive}": supported values: '
                         + ", ".join(f'"{d}"' for d in DIRECTIVES))
    state = RequestFields(directive)
    _current.set(state)
    return state


def report(kind: str, version: str, unknown: list[str]) -> None:
    """Apply the current request's directive to the unknown fields found while pruning."""
    state = _current.get()
    if not unknown or state is None or state.directive == "Ignore":
        return
    if state.directive == "Strict":
        raise StrictDecodingError(kind, version, unknown)
    state.warnings += [f'299 - {json.dumps(f"unknown field {json.dumps(f)}")}' for f in unknown]
