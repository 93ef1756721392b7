"""kube-apiserver's rules for a Pod's volumes and a container's volume mounts (``ValidateVolumes``,
``ValidateVolumeMounts`` in pkg/apis/core/validation), in its words: names, one source each, the sources' required
fields, relative paths without backsteps (``items[].path``, ``subPath``), file modes, mount propagation and
recursive read-only. A job's ``volumes`` and ``volumeMounts`` reach its pods unchanged, so these are the rules that
decide whether its pods can exist.

Differs from a real API server: sources beyond the common ones (hostPath, emptyDir, persistentVolumeClaim,
configMap, secret, nfs, downwardAPI, projected, csi, ephemeral) are checked for being the only source only.
"""
from __future__ import annotations

import posixpath
import re
from typing import Any

from .label_rules import quoted as _q, unsupported
from .object_names import DNS1123_LABEL, format_errors

Errors = list[tuple[str, str]]

SOURCES = (
    "hostPath", "emptyDir", "gcePersistentDisk", "awsElasticBlockStore", "gitRepo", "secret", "nfs", "iscsi",
    "glusterfs", "persistentVolumeClaim", "rbd", "flexVolume", "cinder", "cephfs", "flocker", "downwardAPI", "fc",
    "azureFile", "configMap", "vsphereVolume", "quobyte", "azureDisk", "photonPersistentDisk", "projected",
    "portworxVolume", "scaleIO", "storageos", "csi", "ephemeral", "image")
_HOST_PATH_TYPES = ("", "BlockDevice", "CharDevice", "Directory", "DirectoryOrCreate", "File", "FileOrCreate", "Socket")
_PROPAGATIONS = ("Bidirectional", "HostToContainer", "None")
_RECURSIVE_READ_ONLY = ("Disabled", "Enabled", "IfPossible")
_MODE_MESSAGE = "must be a number between 0 and 0777 (octal), both inclusive"



def _required(field: str, detail: str = "") -> tuple[str, str]:
    return field, f"{field}: Required value" + (f": {detail}" if detail else "")


def _no_backsteps(field: str, path: str) -> Errors:
    if ".." in path.split("/"):
        return [(field, f"{field}: Invalid value: {_q(path)}: must not contain '..'")]
    return []


def _descending_path(field: str, path: str) -> Errors:
    """``validateLocalDescendingPath``: relative, no ``..`` element."""
    errors = [(field, f"{field}: Invalid value: {_q(path)}: must be a relative path")] if posixpath.isabs(path) else []
    return errors + _no_backsteps(field, path)


def _non_reserved_path(field: str, path: str) -> Errors:
    """``validateLocalNonReservedPath``: a descending path that does not start with ``..`` (the kubelet's own
    ``..data`` links)."""
    errors = _descending_path(field, path)
    if path.startswith("..") and not path.startswith("../"):
        errors.append((field, f"{field}: Invalid value: {_q(path)}: must not start with '..'"))
    return errors


def _mode_errors(field: str, mode: Any) -> Errors:
    if isinstance(mode, int) and not 0 <= mode <= 0o777:
        return [(field, f"{field}: Invalid value: {mode}: {_MODE_MESSAGE}")]
    return []


def _items_errors(at: str, items: list[dict[str, Any]] | None) -> Errors:
    """``validateKeyToPath`` for each of a configMap's or secret's ``items``."""
    errors: Errors = []
    for i, item in enumerate(items or []):
        here = f"{at}.items[{i}]"
        if not item.get("key"):
            errors.append(_required(f"{here}.key"))
        if not item.get("path"):
            errors.append(_required(f"{here}.path"))
        errors += _non_reserved_path(f"{here}.path", item.get("path") or "")
        errors += _mode_errors(f"{here}.mode", item.get("mode"))
    return errors


def _source_errors(at: str, kind: str, source: dict[str, Any]) -> Errors:
    here = f"{at}.{kind}"
    if kind == "hostPath":
        path = source.get("path") or ""
        if not path:
            return [_required(f"{here}.path")]
        errors = _no_backsteps(f"{here}.path", path)
        if (source.get("type") or "") not in _HOST_PATH_TYPES:
            errors.append(unsupported(f"{here}.type", source["type"], _HOST_PATH_TYPES))
        return errors
    if kind == "persistentVolumeClaim":
        return [] if source.get("claimName") else [_required(f"{here}.claimName")]
    if kind in ("configMap", "secret"):
        name = "name" if kind == "configMap" else "secretName"
        errors = [] if source.get(name) else [_required(f"{here}.{name}")]
        return errors + _mode_errors(f"{here}.defaultMode", source.get("defaultMode")) + \
            _items_errors(here, source.get("items"))
    if kind == "nfs":
        errors = [] if source.get("server") else [_required(f"{here}.server")]
        path = source.get("path") or ""
        if not path:
            return errors + [_required(f"{here}.path")]
        if not posixpath.isabs(path):
            errors.append((f"{here}.path", f"{here}.path: Invalid value: {_q(path)}: must be an absolute path"))
        return errors
    if kind == "downwardAPI":
        errors = _mode_errors(f"{here}.defaultMode", source.get("defaultMode"))
        for i, item in enumerate(source.get("items") or []):
            item_at = f"{here}.items[{i}]"
            errors += [_required(f"{item_at}.path")] if not item.get("path") else []
            errors += _non_reserved_path(f"{item_at}.path", item.get("path") or "")
            errors += _mode_errors(f"{item_at}.mode", item.get("mode"))
        return errors
    if kind == "projected":
        errors = _mode_errors(f"{here}.defaultMode", source.get("defaultMode"))
        for i, projection in enumerate(source.get("sources") or []):
            for part in ("configMap", "secret"):
                if projection.get(part) is not None:
                    errors += _items_errors(f"{here}.sources[{i}].{part}", projection[part].get("items"))
        return errors
    if kind == "csi":
        return [] if source.get("driver") else [_required(f"{here}.driver")]
    if kind == "ephemeral":
        return [] if source.get("volumeClaimTemplate") else [_required(f"{here}.volumeClaimTemplate")]
    return []


def volume_errors(spec: dict[str, Any]) -> tuple[Errors, set[str]]:
    """Each volume's name (a unique DNS-1123 label), its one source and that source's rules; and the names."""
    errors: Errors = []
    seen: set[str] = set()
    for i, volume in enumerate(spec.get("volumes") or []):
        at, name = f"spec.volumes[{i}]", volume.get("name") or ""
        if not name:
            errors.append(_required(f"{at}.name"))
        elif not re.fullmatch(DNS1123_LABEL, name) or len(name) > 63:
            errors += [(f"{at}.name", f"{at}.name: Invalid value: {_q(name)}: {m}")
                       for m in format_errors(name, "dns1123-label")]
        elif name in seen:
            errors.append((f"{at}.name", f"{at}.name: Duplicate value: {_q(name)}"))
        seen.add(name)
        sources = [s for s in SOURCES if volume.get(s) is not None]
        if not sources:
            errors.append((at, f"{at}: Required value: must specify a volume type"))
        elif len(sources) > 1:
            errors.append((f"{at}.{sources[1]}", f"{at}.{sources[1]}: Forbidden: may not specify more than 1 "
                                                 "volume type"))
        else:
            errors += _source_errors(at, sources[0], volume[sources[0]] or {})
    return errors, seen


def mount_errors(at: str, container: dict[str, Any], volumes: set[str]) -> Errors:
    """``ValidateVolumeMounts`` for one container (``at``: ``spec.containers[i]``). kube-apiserver names the
    ``subPath`` and ``subPathExpr`` paths without the mount's index (``volumeMounts.subPath``); so does this."""
    errors: Errors = []
    paths: set[str] = set()
    privileged = bool((container.get("securityContext") or {}).get("privileged"))
    for m, mount in enumerate(container.get("volumeMounts") or []):
        here = f"{at}.volumeMounts[{m}]"
        if not mount.get("name"):
            errors.append(_required(f"{here}.name"))
        if mount.get("name") not in volumes:
            errors.append((f"{here}.name", f"{here}.name: Not found: {_q(mount.get('name'))}"))
        path = mount.get("mountPath") or ""
        if not path:
            errors.append(_required(f"{here}.mountPath"))
        elif path in paths:
            errors.append((f"{here}.mountPath", f"{here}.mountPath: Invalid value: {_q(path)}: must be unique"))
        paths.add(path)
        if mount.get("subPath"):
            errors += _descending_path(f"{at}.volumeMounts.subPath", mount["subPath"])
        if mount.get("subPathExpr"):
            if mount.get("subPath"):
                errors.append((f"{here}.subPathExpr", f"{here}.subPathExpr: Invalid value: "
                                                      f"{_q(mount['subPathExpr'])}: subPathExpr and subPath are "
                                                      "mutually exclusive"))
            errors += _descending_path(f"{at}.volumeMounts.subPathExpr", mount["subPathExpr"])
        propagation = mount.get("mountPropagation")
        if propagation is not None:
            field = f"{here}.mountPropagation"
            if propagation not in _PROPAGATIONS:
                errors.append(unsupported(field, propagation, _PROPAGATIONS))
            elif propagation == "Bidirectional" and not privileged:
                errors.append((field, f"{field}: Forbidden: Bidirectional mount propagation is available only to "
                                      "privileged containers"))
        recursive = mount.get("recursiveReadOnly")
        if recursive is not None and recursive != "Disabled":
            field = f"{here}.recursiveReadOnly"
            if recursive not in _RECURSIVE_READ_ONLY:
                errors.append(unsupported(field, recursive, _RECURSIVE_READ_ONLY))
            else:
                if not mount.get("readOnly"):
                    errors.append((field, f"{field}: Forbidden: may only be specified when readOnly is true"))
                if propagation not in (None, "None"):
                    errors.append((field, f"{field}: Forbidden: may only be specified when mountPropagation is None "
                                          "or not specified"))
    return errors
