"""RL prompt samples (the R1AlpacaStyleInstructionHandler's output): a prompt and its reference answer each.

The files are MindSpeed-RL's ``<prefix>_packed_{input_ids,attention_mask,labels}_document``: ``input_ids`` is
the prompt rendered up to the assistant header, ``labels`` the tokens of the reference answer (a different
length, unlike SFT data, so the three are not checked against each other). Samples are shuffled per epoch as
the instruction samples are.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from .sources import DataError, train_range


class PromptDataset:
    def __init__(self, files: dict[str, str], seed: int, split: str, name: str):
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        self.prompts = IndexedDataset(files["input_ids"], mmap=True)
        self.references = IndexedDataset(files["labels"], mmap=True)
        if len(self.prompts) != len(self.references):
            raise DataError(f"data.dataPath: {name} has {len(self.prompts)} prompts but {len(self.references)} "
                            "reference answers (labels); prepare it again")
        self.indices = np.asarray(train_range(len(self.prompts), split), dtype=np.int64)
        if not len(self.indices):
            raise DataError(f"data.split: leaves no training prompts in {name} ({len(self.prompts)} prompts)")
        self.seed, self.name = seed, name

    @lru_cache(maxsize=2)
    def _order(self, epoch: int) -> np.ndarray:
        return np.random.RandomState((self.seed + 7919 * epoch) % 2**32).permutation(self.indices)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        epoch, within = divmod(index, len(self.indices))
        row = int(self._order(epoch)[within])
        prompt = np.asarray(self.prompts[row]).astype(np.int64).tolist()
        if not prompt:
            raise DataError(f"data.dataPath: prompt {row} of {self.name} is empty")
        return {"prompt": prompt, "reference": np.asarray(self.references[row]).astype(np.int64).tolist()}


def prompt_batch(rows: list[dict[str, list[int]]]) -> dict[str, list[list[int]]]:
    """Prompts stay token lists: the rollout lays them out itself."""
    return {"prompts": [r["prompt"] for r in rows], "references": [r["reference"] for r in rows]}
