"""``dryRun=All``: a write that runs every step a real one does (defaulting, schema and CEL validation,
admission, conflicts) and answers with the object it would have stored, then leaves no trace.

The API applies writes synchronously in its event loop, so a write can run for real against the store and be
rolled back before any other request (or watch) runs: nothing else sees the intermediate state.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

DRY_RUN_VALUE = "All"  # the only value the Kubernetes API accepts


def check(values: list[str]) -> str | None:
    """The error message for a bad ``dryRun`` query, None when it is ``All``."""
    if values == [DRY_RUN_VALUE]:
        return None
    return f"Invalid dry run value: {values}; the only accepted value is {DRY_RUN_VALUE!r}"


@contextlib.contextmanager
def rolled_back(api: Any) -> Iterator[None]:
    """Undo every change to the store, uids, resource types, discovery and watch log made inside the block."""
    saved = (dict(api._store), dict(api._uids), api._rv, len(api._log), api._log_floor, dict(api._types),
             dict(api.resources))
    try:
        yield
    finally:
        store, uids, rv, log_length, log_floor, types, discovery = saved
        api._store.clear()
        api._store.update(store)
        api._uids.clear()
        api._uids.update(uids)
        api._rv, api._log_floor = rv, log_floor
        del api._log[log_length:]
        api._types.clear()
        api._types.update(types)
        api.resources.clear()
        api.resources.update(discovery)
