"""Instruction samples: one stored sequence each (a single sample, or a packed group), shuffled per epoch.

The three datasets ``<prefix>_packed_{input_ids,attention_mask,labels}_document`` hold, per sequence, the
tokens, the attention mask (1 everywhere; with neat packing the sample number 1..k and 0 for padding) and the
labels (-100 where no loss is taken: prompts, system text, padding).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from .sources import INSTRUCTION_KEYS, SPLIT_PARTS, DataError, split_range


class InstructionDataset:
    def __init__(self, files: dict[str, str], seed: int, split: str, name: str, part: int = 0):
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        self.data = {k: IndexedDataset(files[k], mmap=True) for k in INSTRUCTION_KEYS}
        lengths = {k: self.data[k].sequence_lengths for k in INSTRUCTION_KEYS}
        counts = {k: len(v) for k, v in lengths.items()}
        if len(set(counts.values())) != 1 or not all(np.array_equal(lengths["input_ids"], v) for v in lengths.values()):
            raise DataError(f"data.dataPath: the three datasets of {name} disagree (sequence counts {counts}); "
                            "prepare it again")
        self.indices = np.asarray(split_range(counts["input_ids"], split, part), dtype=np.int64)
        if not len(self.indices):
            raise DataError(f"data.split: leaves no {SPLIT_PARTS[part]} samples in {name} "
                            f"({counts['input_ids']} samples)")
        self.seed = seed

    @lru_cache(maxsize=2)
    def _order(self, epoch: int) -> np.ndarray:
        return np.random.RandomState((self.seed + 7919 * epoch) % 2**32).permutation(self.indices)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        epoch, within = divmod(index, len(self.indices))
        row = int(self._order(epoch)[within])
        return {k: np.asarray(self.data[k][row]).astype(np.int64) for k in INSTRUCTION_KEYS}
