"""Micro-batches for one data-parallel rank, laid out as Megatron's pretraining sampler does.

A global batch of ``micro x dp x num_micro`` consecutive samples starts at ``consumed``; micro-batch ``k`` of
rank ``r`` holds samples ``consumed + (k * dp + r) * micro + [0, micro)``. Resuming therefore only needs the
count of consumed samples.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

Batch = dict[str, torch.Tensor]


def micro_batches(sample: Callable[[int], Any], collate: Callable[[list], Batch], consumed: int, micro: int,
                  dp: int, dp_rank: int, num_micro: int) -> Iterator[Batch]:
    for k in range(num_micro):
        first = consumed + (k * dp + dp_rank) * micro
        yield collate([sample(first + j) for j in range(micro)])
