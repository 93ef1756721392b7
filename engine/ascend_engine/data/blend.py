"""Blending several datasets by weight: sample ``i`` of the mix is sample ``k`` of dataset ``d``.

The choice is Megatron's greedy rule: at every step take the dataset that lags its weight the most
(``weight x samples so far - taken so far``), so any prefix of the mix follows the weights as closely as whole
samples allow, and the mapping depends only on the weights (a resumed run sees the same mix).
"""
from __future__ import annotations

import numpy as np

CHUNK = 4096


class Blend:
    def __init__(self, weights: list[float]):
        self.weights = np.asarray(weights, dtype=np.float64)
        self.dataset = np.empty(0, dtype=np.int64)
        self.within = np.empty(0, dtype=np.int64)
        self.taken = np.zeros(len(weights), dtype=np.int64)

    def _extend(self, upto: int) -> None:
        n = len(self.dataset)
        size = max(upto + 1 - n, CHUNK)
        dataset, within = np.empty(size, dtype=np.int64), np.empty(size, dtype=np.int64)
        for j in range(size):
            d = int(np.argmax(self.weights * (n + j + 1) - self.taken))
            dataset[j], within[j] = d, self.taken[d]
            self.taken[d] += 1
        self.dataset = np.concatenate([self.dataset, dataset])
        self.within = np.concatenate([self.within, within])

    def __getitem__(self, index: int) -> tuple[int, int]:
        if len(self.weights) == 1:
            return 0, index
        if index >= len(self.dataset):
            self._extend(index)
        return int(self.dataset[index]), int(self.within[index])
