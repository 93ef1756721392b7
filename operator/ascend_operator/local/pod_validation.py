"""A few of kube-apiserver's Pod spec checks, the ones a job's pod template can break, in its words:
duplicate volume names (a user volume named like one of the operator's), mounts of volumes that do not exist,
and toleration operators. Differs from a real API server: the rest of ``ValidatePodSpec`` is not emulated.
"""
from __future__ import annotations

from typing import Any

_TOLERATION_OPERATORS = ("Equal", "Exists")


def pod_spec_errors(pod: dict[str, Any]) -> list[tuple[str, str]]:
    spec = pod.get("spec") or {}
    errors: list[tuple[str, str]] = []
    seen: set[str] = set()
    for i, volume in enumerate(spec.get("volumes") or []):
        name = volume.get("name", "")
        if name in seen:
            field = f"spec.volumes[{i}].name"
            errors.append((field, f'{field}: Duplicate value: "{name}"'))
        seen.add(name)
    for c, container in enumerate(spec.get("containers") or []):
        for m, mount in enumerate(container.get("volumeMounts") or []):
            if mount.get("name") not in seen:
                field = f"spec.containers[{c}].volumeMounts[{m}].name"
                errors.append((field, f'{field}: Not found: "{mount.get("name")}"'))
    for t, toleration in enumerate(spec.get("tolerations") or []):
        operator = toleration.get("operator")
        if operator is not None and operator not in _TOLERATION_OPERATORS:
            field = f"spec.tolerations[{t}].operator"
            errors.append((field, f'{field}: Unsupported value: "{operator}": supported values: '
                                  + ", ".join(f'"{o}"' for o in _TOLERATION_OPERATORS)))
    return errors
