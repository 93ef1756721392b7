"""kube-apiserver's ``ValidateObjectMeta`` on every write of every kind (custom objects included): label keys are
qualified names and values at most 63 characters of the label alphabet; annotation keys are qualified names and all
annotations together at most 256 KiB; owner references name a version, kind, name and uid, one of them at most the
controller; finalizers are qualified names."""
from __future__ import annotations

from typing import Any

from .label_rules import label_errors, qualified_name_errors, quoted

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
    return errors + _owner_errors(meta.get("ownerReferences")) + _finalizer_errors(meta.get("finalizers"))


def _owner_errors(owners: Any) -> list[tuple[str, str]]:
    """``ValidateOwnerReferences``: kube-apiserver names the list, not the entry (``metadata.ownerReferences.uid``)."""
    at = "metadata.ownerReferences"
    errors: list[tuple[str, str]] = []
    for owner in owners or []:
        present = {"apiVersion": str(owner.get("apiVersion") or "").rpartition("/")[2], "kind": owner.get("kind"),
                   "name": owner.get("name"), "uid": owner.get("uid")}
        for key, what in (("apiVersion", "version"), ("kind", "kind"), ("name", "name"), ("uid", "uid")):
            if not present[key]:
                errors.append((f"{at}.{key}", f"{at}.{key}: Invalid value: {quoted(owner.get(key) or '')}: {what} "
                                              "must not be empty"))
    controllers = [o for o in owners or [] if o.get("controller")]
    if len(controllers) > 1:
        found = ", ".join(f"{o.get('kind')}/{o.get('name')}" for o in controllers)
        errors.append((at, f"{at}: Invalid value: {quoted(owners)}: Only one reference can have Controller set to "
                           f"true. Found \"true\" in references for {found}"))
    return errors


def _finalizer_errors(finalizers: Any) -> list[tuple[str, str]]:
    return [e for name in finalizers or [] for e in qualified_name_errors("metadata.finalizers", str(name))]
