"""apimachinery's rules for qualified names and labels (``IsQualifiedName``, ``ValidateLabels``) and the wording
of its errors, shared by every object's metadata and the Pod rules (node selector, tolerations, affinity, volumes,
env, security contexts)."""
from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from .object_names import format_errors

QUALIFIED_NAME = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
QUALIFIED_NAME_MESSAGE = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
                          "end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
                          f"used for validation is '{QUALIFIED_NAME}')")
LABEL_VALUE = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"
LABEL_VALUE_MESSAGE = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
                       "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
                       f"'my_value',  or '12345', regex used for validation is '{LABEL_VALUE}')")


def quoted(value: Any) -> str:
    return json.dumps(value)


def unsupported(field: str, value: Any, allowed: tuple[str, ...]) -> tuple[str, str]:
    """``field.NotSupported``: the value and the values the field takes."""
    return field, f"{field}: Unsupported value: {quoted(value)}: supported values: " + \
        ", ".join(quoted(a) for a in allowed)


def qualified_name_errors(field: str, key: str) -> list[tuple[str, str]]:
    """apimachinery's IsQualifiedName: an optional DNS-1123 subdomain prefix and a name part of 63 characters."""
    prefix, _, name = key.rpartition("/")
    out = []
    if "/" in key and (not prefix or format_errors(prefix, "dns1123-subdomain")):
        out.append((field, f"{field}: Invalid value: {quoted(key)}: prefix part must be a lowercase RFC 1123 "
                           "subdomain"))
    if not name or len(name) > 63 or not re.fullmatch(QUALIFIED_NAME, name):
        out.append((field, f"{field}: Invalid value: {quoted(key)}: {QUALIFIED_NAME_MESSAGE}"))
    return out


def label_errors(field: str, labels: Any) -> list[tuple[str, str]]:
    """apimachinery's ValidateLabels: qualified-name keys, values of at most 63 characters in the label alphabet."""
    errors: list[tuple[str, str]] = []
    for key, value in (labels or {}).items():
        if not (type(key) is str and type(value) is str and _valid_label(key, value)):
            errors += qualified_name_errors(field, key) + label_value_errors(field, value)
    return errors


@lru_cache(maxsize=16384)  # the same few labels are on every object of a job, and of every job
def _valid_label(key: str, value: str) -> bool:
    return not qualified_name_errors("", key) and not label_value_errors("", value)


def label_value_errors(field: str, value: Any) -> list[tuple[str, str]]:
    """One label value (``IsValidLabelValue``), as selectors' values are checked."""
    value = "" if value is None else str(value)
    if len(value) > 63:
        return [(field, f"{field}: Invalid value: {quoted(value)}: must be no more than 63 characters")]
    if not re.fullmatch(LABEL_VALUE, value):
        return [(field, f"{field}: Invalid value: {quoted(value)}: {LABEL_VALUE_MESSAGE}")]
    return []
