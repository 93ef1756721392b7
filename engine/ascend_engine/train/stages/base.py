"""The seam between the loop and a stage (see ``stages/__init__.py``)."""
from __future__ import annotations

from typing import Any

import torch

from ...config.train import TrainConfig

Batch = dict[str, torch.Tensor]


class Stage:
    rows_per_sample = 1
    """Model rows per data sample (a preference pair is two: chosen and rejected)."""
    metric_keys: tuple[str, ...] = ("lm loss",)
    """What the loss function reports per micro-batch, averaged over micro-batches and data-parallel ranks; the
    first is the loss."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.trainer: Any = None

    def setup(self, trainer) -> None:
        """Called once the trainer's model and starting checkpoint are in place."""
        self.trainer = trainer

    def prepare(self, batches: list[Batch]) -> list[Batch]:
        """This step's micro-batches, before the schedule runs (collective on all ranks)."""
        return batches

    def forward_step(self, data_iterator, model):
        """Megatron's forward-step function: (output tensor, loss function of that output)."""
        raise NotImplementedError


def per_token_loss(trainer, model, batch: Batch) -> torch.Tensor:
    """The model's per-token cross-entropy [b, s] of ``batch["labels"]`` (vocab-parallel under TP; on the last
    pipeline stage, a hidden-state tensor elsewhere)."""
    from ...models.gpt import rope_positions
    from ..loop import unwrap

    device = trainer.backend.torch_device
    tokens = batch["tokens"].to(device)
    if int(tokens.max()) >= trainer.vocab_size:
        from ...data.sources import DataError

        raise DataError(f"data.dataPath: token id {int(tokens.max())} is outside the model's vocabulary "
                        f"({trainer.vocab_size}); set model.vocabSize / paddedVocabSize for this tokenizer")
    position_ids = batch.get("position_ids")
    if position_ids is None:
        position_ids = torch.arange(tokens.shape[1]).unsqueeze(0).expand_as(tokens)
    attention_mask = batch.get("attention_mask")
    return model(tokens, rope_positions(unwrap(model), position_ids.to(device)),
                 attention_mask.to(device) if attention_mask is not None else None,
                 labels=batch["labels"].to(device))
