"""Label and field selectors as the API server parses them (``?labelSelector=``, ``?fieldSelector=``)."""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Matcher = Callable[[Mapping[str, Any]], bool]


class SelectorError(ValueError):
    """A selector that does not parse; the API answers 400 Bad Request with this message."""


def _split_terms(text: str) -> list[str]:
    """Split on commas outside parentheses: ``a in (x,y),b`` -> [``a in (x,y)``, ``b``]."""
    terms, depth, current = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    terms.append("".join(current).strip())
    return [t for t in terms if t]


_SET_TERM = re.compile(r"^(\S+)\s+(in|notin)\s+\((.*)\)$")
_EQ_TERM = re.compile(r"^([^!=\s]+)\s*(==|=|!=)\s*(\S*)$")
_KEY = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?$")


def _label_term(term: str) -> Callable[[Mapping[str, str]], bool]:
    if m := _SET_TERM.match(term):
        key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",") if v.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if m := _EQ_TERM.match(term):
        key, op, value = m.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if term.startswith("!") and _KEY.match(term[1:].strip()):
        key = term[1:].strip()
        return lambda labels: key not in labels
    if _KEY.match(term):
        return lambda labels: term in labels
    raise SelectorError(f"unable to parse requirement: {term!r}")


def label_selector(text: str | None) -> Matcher:
    """A predicate on whole objects for ``labelSelector`` (equality-based and set-based terms, ANDed)."""
    terms = [_label_term(t) for t in _split_terms(text or "")]

    def matches(obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(term(labels) for term in terms)

    return matches


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


def field_selector(text: str | None) -> Matcher:
    """A predicate for ``fieldSelector``: ``path=value``, ``path==value``, ``path!=value``, ANDed.

    Differs from a real API server: any dotted path is accepted (the real one allows only
    ``metadata.name``, ``metadata.namespace`` and a few fields per kind, such as a pod's ``spec.nodeName``).
    """
    terms = []
    for term in _split_terms(text or ""):
        m = _EQ_TERM.match(term)
        if not m:
            raise SelectorError(f"invalid field selector: {term!r}")
        terms.append(m.groups())

    def matches(obj: Mapping[str, Any]) -> bool:
        for path, op, value in terms:
            if (_field_value(obj, path) == value) != (op != "!="):
                return False
        return True

    return matches
