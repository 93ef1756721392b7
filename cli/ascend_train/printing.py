"""Tables like ``kubectl get``: columns from a CRD's additionalPrinterColumns (kubectl's JSONPath subset)."""
from __future__ import annotations

import datetime
import re
from typing import Any

_STEP = re.compile(r"\.([A-Za-z0-9_\-/]+)|\[(\d+)\]|\[\?\(@\.([\w.]+)==[\"']([^\"']*)[\"']\)\]")


def jsonpath(obj: Any, path: str) -> Any:
    """Evaluate ``.a.b[0]`` and ``.conditions[?(@.type=="Ready")].status``; None when a step is missing."""
    value = obj
    for m in _STEP.finditer(path.strip().strip("{}")):
        key, index, filter_key, filter_value = m.groups()
        if key is not None:
            value = value.get(key) if isinstance(value, dict) else None
        elif index is not None:
            value = value[int(index)] if isinstance(value, list) and int(index) < len(value) else None
        else:
            matches = [v for v in value or [] if isinstance(v, dict) and str(jsonpath(v, "." + filter_key)) == filter_value]
            value = matches[0] if matches else None
        if value is None:
            return None
    return value


def age(timestamp: str | None, now: datetime.datetime | None = None) -> str:
    """``5s``, ``3m12s``, ``2h5m``, ``4d`` as kubectl shows ages."""
    if not timestamp:
        return "<unknown>"
    created = datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)
    seconds = int(((now or datetime.datetime.now(datetime.timezone.utc)) - created).total_seconds())
    seconds = max(0, seconds)
    if seconds < 120:
        return f"{seconds}s"
    minutes, hours = seconds // 60, seconds // 3600
    if hours < 1:
        return f"{minutes}m{seconds % 60}s" if minutes < 10 else f"{minutes}m"
    if hours < 48:
        return f"{hours}h{minutes % 60}m" if hours < 8 else f"{hours}h"
    return f"{hours // 24}d"


def _cell(value: Any, kind: str) -> str:
    if value is None:
        return "<none>" if kind != "date" else "<unknown>"
    if kind == "date":
        return age(str(value))
    if kind == "number" and isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return str(value)
    return str(value)


def table(objects: list[dict[str, Any]], columns: list[dict[str, Any]], with_namespace: bool = False,
          age_column: bool = True) -> str:
    """Aligned text: NAME first, then the printer columns (priority 0), AGE last when the CRD gives none."""
    columns = [c for c in columns if not c.get("priority")]
    if age_column and not any(c.get("type") == "date" for c in columns):
        columns = columns + [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]
    headers = (["NAMESPACE"] if with_namespace else []) + ["NAME"] + [c["name"].upper() for c in columns]
    rows = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        row = ([meta.get("namespace", "")] if with_namespace else []) + [meta.get("name", "")]
        row += [_cell(jsonpath(obj, c["jsonPath"]), c.get("type", "string")) for c in columns]
        rows.append(row)
    widths = [max(len(r[i]) for r in [headers] + rows) for i in range(len(headers))]
    lines = ["   ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [headers] + rows]
    return "\n".join(lines)
