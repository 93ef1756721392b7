"""Chunks through N tokenizer processes, results back in input order, a bounded number in flight.

``multiprocessing.Pool.imap`` would read the whole input ahead into its task queue; here at most
``inflight`` chunks exist at any time, so memory is bounded by chunks, not by the dataset.
"""
from __future__ import annotations

import multiprocessing
from collections import deque
from typing import Iterable, Iterator

from ..config.prep import PrepConfig
from .encode import Chunk, ChunkProcessor, ChunkResult

_processor: ChunkProcessor | None = None


def _init_worker(config: dict) -> None:
    global _processor
    _processor = ChunkProcessor(PrepConfig.model_validate(config))


def _process(chunk: Chunk) -> ChunkResult:
    return _processor.process(chunk)


def process_chunks(chunks: Iterable[Chunk], processor: ChunkProcessor, workers: int,
                   inflight: int) -> Iterator[ChunkResult]:
    """Results in chunk order. ``workers == 1`` runs in this process (no pickling, same code path)."""
    if workers == 1:
        for chunk in chunks:
            yield processor.process(chunk)
        return
    # fork: the workers inherit the imported tokenizer libraries instead of importing them again.
    context = multiprocessing.get_context("fork")
    pool = context.Pool(workers, initializer=_init_worker, initargs=(processor.cfg.model_dump(),))
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
