"""Chunks through N tokenizer processes, results back in input order, a bounded number in flight.

``multiprocessing.Pool.imap`` would read the whole input ahead into its task queue; here at most
``inflight`` chunks exist at any time, so memory is bounded by chunks, not by the dataset.
"""
from __future__ import annotations

import multiprocessing
from collections import deque
from typing import Iterable, Iterator

from .encode import Chunk, ChunkProcessor, ChunkResult

_processor: ChunkProcessor | None = None


def _process(chunk: Chunk) -> ChunkResult:
    return _processor.process(chunk)


def process_chunks(chunks: Iterable[Chunk], processor: ChunkProcessor, workers: int,
                   inflight: int) -> Iterator[ChunkResult]:
    """Results in chunk order. ``workers == 1`` runs in this process (no pickling, same code path)."""
    if workers == 1:
        for chunk in chunks:
            yield processor.process(chunk)
        return
    # fork: the workers inherit this process's processor (tokenizer loaded, tiktoken checked) as it is.
    global _processor
    _processor = processor
    pool = multiprocessing.get_context("fork").Pool(workers)
    try:
        pending: deque = deque()
        for chunk in chunks:
            pending.append(pool.apply_async(_process, (chunk,)))
            if len(pending) >= inflight:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
        pool.close()
    finally:
        pool.terminate()
        pool.join()
        _processor = None
