"""Pretraining samples: fixed windows over the shuffled, concatenated documents of a ``_text_document`` dataset.

Each epoch shuffles the training documents (a permutation seeded by ``seed`` and the epoch), lays them back to
back and cuts windows of ``seq_length + 1`` tokens with stride ``seq_length`` (Megatron's GPT dataset shape:
inputs are the first ``seq_length`` tokens, targets the last). The order of windows is shuffled too. Sample
``i`` therefore depends only on ``i``, which is what makes a resumed run continue at the exact sample.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from .sources import SPLIT_PARTS, DataError, split_range


class PretrainDataset:
    def __init__(self, prefix: str, seq_length: int, seed: int, split: str, name: str, part: int = 0):
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        self.data = IndexedDataset(prefix, mmap=True)
        self.seq_length, self.seed = seq_length, seed
        doc_index = self.data.document_indices  # sequence boundaries of each document, with a leading 0
        docs = split_range(len(doc_index) - 1, split, part)
        if not len(docs):
            raise DataError(f"data.split: leaves no {SPLIT_PARTS[part]} documents in {name} "
                            f"({len(doc_index) - 1} documents)")
        self.doc_first = doc_index[docs.start:docs.stop].astype(np.int64)
        self.doc_last = doc_index[docs.start + 1:docs.stop + 1].astype(np.int64)
        seq_lengths = self.data.sequence_lengths.astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(seq_lengths)])
        self.doc_tokens = starts[self.doc_last] - starts[self.doc_first]
        total = int(self.doc_tokens.sum())
        self.samples_per_epoch = (total - 1) // seq_length
        if self.samples_per_epoch < 1:
            raise DataError(f"data.dataPath: {name} has {total} {SPLIT_PARTS[part]} tokens, fewer than seqLength + 1 "
                            f"({seq_length + 1}); use more data or a shorter training.seqLength")

    @lru_cache(maxsize=2)
    def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rng = np.random.RandomState((self.seed + 7919 * epoch) % 2**32)
        order = rng.permutation(len(self.doc_tokens))
        ends = np.cumsum(self.doc_tokens[order])
        windows = rng.permutation(self.samples_per_epoch)
        return order, ends, windows

    def _tokens(self, doc: int) -> np.ndarray:
        first, last = self.doc_first[doc], self.doc_last[doc]
        return np.concatenate([np.asarray(self.data[int(s)]) for s in range(first, last)])

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        epoch, within = divmod(index, self.samples_per_epoch)
        order, ends, windows = self._epoch(epoch)
        start = int(windows[within]) * self.seq_length
        stop = start + self.seq_length + 1
        pieces, d = [], int(np.searchsorted(ends, start, side="right"))  # the document holding `start`
        while d < len(ends):
            doc_start = int(ends[d - 1]) if d else 0
            if doc_start >= stop:
                break
            pieces.append(self._tokens(int(order[d]))[max(start - doc_start, 0):stop - doc_start])
            d += 1
        return {"text": np.concatenate(pieces).astype(np.int64)}
