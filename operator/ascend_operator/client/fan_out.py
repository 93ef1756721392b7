"""A job's many API calls (create or delete a gang's pods) issued a few at a time from one shared thread pool.

One call at a time, a 4096-node gang restart is 8192 round trips in a row; all at once, one job would take every
connection and every thread. Each job keeps at most ``PER_JOB_CONCURRENCY`` calls in flight, on a pool that all
jobs share, so a second job's calls interleave with the first's (as the Job controller's batched pod creation,
bounded per job).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TypeVar

from ..settings import API_THREADS, PER_JOB_CONCURRENCY

T = TypeVar("T")
R = TypeVar("R")

_POOL = ThreadPoolExecutor(max_workers=API_THREADS, thread_name_prefix="api")


def each(call: Callable[[T], R], items: Iterable[T], limit: int = PER_JOB_CONCURRENCY) -> list[R | Exception]:
    """``call(item)`` for every item, at most ``limit`` at once; results (or the exception raised) in order."""
    items = list(items)
    results: list[R | Exception] = [None] * len(items)  # type: ignore[list-item]
    pending: dict[Future, int] = {}
    todo = iter(range(len(items)))
    for i in todo:
        pending[_POOL.submit(call, items[i])] = i
        if len(pending) >= limit:
            break
    while pending:
        finished, _ = wait(pending, return_when=FIRST_COMPLETED)
        for f in finished:
            i = pending.pop(f)
            error = f.exception()
            results[i] = error if error is not None else f.result()  # type: ignore[assignment]
            nxt = next(todo, None)
            if nxt is not None:
                pending[_POOL.submit(call, items[nxt])] = nxt
    return results
