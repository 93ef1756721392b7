"""The one convention every engine config follows.

A config is a pydantic model. Each field is written once and serves three readers:

* the YAML/CRD name is the camelCase alias (``tensorModelParallelSize``), as Kubernetes APIs spell fields;
* the CLI flag is the Megatron / MindSpeed-LLM name users already type, attached as ``Flag`` metadata:
  ``tp: Annotated[int, Flag("--tensor-model-parallel-size")] = 1``;
* the description is the attribute docstring, which pydantic copies into the JSON schema and so into the CRD.

Nothing here imports torch: the operator imports these models to build CRDs and ConfigMaps.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationInfo
from pydantic.alias_generators import to_camel


class Flag:
    """CLI names of a field. ``invert`` makes a bool flag store False (``--no-load-optim`` for ``loadOptim``)."""

    def __init__(self, *names: str, invert: bool = False, help: str | None = None):
        if not names or not all(n.startswith("--") for n in names):
            raise ValueError(f"flag names must start with '--': {names}")
        self.names = names
        self.invert = invert
        self.help = help

    def __repr__(self) -> str:
        return f"Flag({', '.join(self.names)})"


class EngineModel(BaseModel):
    """Base for every engine config section: strict keys, camelCase aliases, docstrings as descriptions."""

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        alias_generator=to_camel,
        use_attribute_docstrings=True,
        validate_assignment=True,
    )

    def to_yaml_dict(self) -> dict[str, Any]:
        """The form the operator writes into a ConfigMap and the engine reads back (aliases, no unset defaults)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def not_null(instead: str) -> BeforeValidator:
    """Refuse ``null`` on a field that has a default, naming the explicit value to write instead.

    A Kubernetes API server never stores such a null: in a JSON merge patch (every ``kubectl apply`` after the
    first) null means "remove the field", and the server then fills in the schema's default; on create a null on
    a non-nullable field is dropped and defaulted too. So "null means off" would silently turn back into the
    default on the next apply; these fields say "off" with an explicit value instead."""

    def check(value: Any, info: ValidationInfo) -> Any:
        if value is None:
            if (info.context or {}).get("kubernetes", True):
                raise ValueError(f"null is not kept by the Kubernetes API server (it removes the field and applies "
                                 f"the default); write {instead}")
            raise ValueError(f"null is not a value of this field: write {instead}, or leave the field out for its "
                             f"default")
        return value

    return BeforeValidator(check)
