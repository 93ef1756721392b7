"""kube-apiserver's ``ValidateObjectMeta`` for labels and annotations, on every write of every kind (custom
objects included): label keys are qualified names and values at most 63 characters of the label alphabet;
annotation keys are qualified names and all annotations together at most 256 KiB."""
from __future__ import annotations

from typing import Any

from .label_rules import label_errors, qualified_name_errors

ANNOTATIONS_MAX_BYTES = 256 * 1024


def metadata_errors(obj: dict[str, Any]) -> list[tuple[str, str]]:
    meta = obj.get("metadata") or {}
    errors = label_errors("metadata.labels", meta.get("labels"))
    annotations = meta.get("annotations") or {}
    for key in annotations:
        errors += qualified_name_errors("metadata.annotations", key.lower())
    size = sum(len(k.encode()) + len(str(v or "").encode()) for k, v in annotations.items())
    if size > ANNOTATIONS_MAX_BYTES:
        errors.append(("metadata.annotations", f"metadata.annotations: Too long: must have at most "
                                               f"{ANNOTATIONS_MAX_BYTES} bytes"))
    return errors
