"""Object-name validation as kube-apiserver applies it, with apimachinery's messages word for word.

Services are DNS-1035 labels (``ValidateServiceName``), namespaces DNS-1123 labels, everything else (pods,
ConfigMaps, Secrets, custom objects, ...) DNS-1123 subdomains; a pod's ``spec.hostname`` and ``spec.subdomain``
are DNS-1123 labels. Events are exempt: their names carry ``.`` suffixes and the server accepts any path segment.
"""
from __future__ import annotations

import re
from typing import Any

DNS1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN = DNS1123_LABEL + r"(\." + DNS1123_LABEL + ")*"
DNS1035_LABEL = "[a-z]([-a-z0-9]*[a-z0-9])?"

_FORMATS = {
    # format -> (regex, max length, message, examples), from k8s.io/apimachinery/pkg/util/validation.
    "dns1123-label": (DNS1123_LABEL, 63, "a lowercase RFC 1123 label must consist of lower case alphanumeric "
                      "characters or '-', and must start and end with an alphanumeric character",
                      ("my-name", "123-abc")),
    "dns1123-subdomain": (DNS1123_SUBDOMAIN, 253, "a lowercase RFC 1123 subdomain must consist of lower case "
                          "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric "
                          "character", ("example.com",)),
    "dns1035-label": (DNS1035_LABEL, 63, "a DNS-1035 label must consist of lower case alphanumeric characters or "
                      "'-', start with an alphabetic character, and end with an alphanumeric character",
                      ("my-name", "abc-123")),
}


def _regex_error(message: str, regex: str, examples: tuple[str, ...]) -> str:
    """apimachinery's ``RegexError`` (its double space after a comma included)."""
    text = message + " (e.g. "
    for i, example in enumerate(examples):
        text += (" or " if i else "") + f"'{example}', "
    return text + "regex used for validation is '" + regex + "')"


def format_errors(value: str, fmt: str) -> list[str]:
    regex, longest, message, examples = _FORMATS[fmt]
    errors = []
    if len(value) > longest:
        errors.append(f"must be no more than {longest} characters")
    if not re.fullmatch(regex, value):
        errors.append(_regex_error(message, regex, examples))
    return errors


def name_format(group: str, plural: str) -> str | None:
    if group in ("", "events.k8s.io") and plural == "events":
        return None
    if not group and plural == "services":
        return "dns1035-label"
    if not group and plural == "namespaces":
        return "dns1123-label"
    return "dns1123-subdomain"


def object_errors(group: str, plural: str, obj: dict[str, Any]) -> list[tuple[str, str]]:
    """``(field, message)`` for every invalid name in ``obj``, in the API server's wording."""
    out = []
    fmt = name_format(group, plural)
    name = (obj.get("metadata") or {}).get("name") or ""
    if fmt:
        out += [("metadata.name", f'metadata.name: Invalid value: "{name}": {m}') for m in format_errors(name, fmt)]
    if not group and plural == "pods":
        spec = obj.get("spec") or {}
        for field in ("hostname", "subdomain"):
            if spec.get(field):
                out += [(f"spec.{field}", f'spec.{field}: Invalid value: "{spec[field]}": {m}')
                        for m in format_errors(spec[field], "dns1123-label")]
    return out
