"""Micro-batches for one data-parallel rank, laid out as Megatron's pretraining sampler does.

A global batch of ``micro x dp x num_micro`` consecutive samples starts at ``consumed``; micro-batch ``k`` of
rank ``r`` holds samples ``consumed + (k * dp + r) * micro + [0, micro)``. Resuming therefore only needs the
count of consumed samples.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..data.sources import DataError

Batch = dict[str, torch.Tensor]


def micro_batches(sample: Callable[[int], Any], collate: Callable[[list], Batch], consumed: int, micro: int,
                  dp: int, dp_rank: int, num_micro: int, vocab_size: int) -> Iterator[Batch]:
    for k in range(num_micro):
        first = consumed + (k * dp + dp_rank) * micro
        batch = collate([sample(first + j) for j in range(micro)])
        # token rows: "tokens" [b, s] for the language-model and pairwise stages, GRPO's ragged "prompts"
        check_vocabulary(batch["tokens"] if "tokens" in batch else batch["prompts"], vocab_size, first)
        yield batch


def check_vocabulary(tokens: torch.Tensor | list[list[int]], vocab_size: int, first_sample: int) -> None:
    """Refuse token ids the embedding does not have, naming the sample (row ``i`` is ``first_sample + i``).

    Runs on the host copy, before the batch goes to the device: the same check on the device would wait for
    the device (a device-to-host sync) on every micro-batch.
    """
    if isinstance(tokens, torch.Tensor):
        if not tokens.numel() or int(tokens.max()) < vocab_size:
            return
        row = int((tokens >= vocab_size).any(dim=-1).nonzero()[0])
        largest = int(tokens[row].max())
    else:
        bad = [i for i, ids in enumerate(tokens) if ids and max(ids) >= vocab_size]
        if not bad:
            return
        row, largest = bad[0], max(tokens[bad[0]])
    raise DataError(f"data.dataPath: sample {first_sample + row} of the run holds token id {largest}, outside "
                    f"the model's vocabulary ({vocab_size}); set model.vocabSize / paddedVocabSize for this "
                    "tokenizer")
