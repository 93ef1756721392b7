"""The seam between the loop and a stage (see ``stages/__init__.py``)."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ...config.train import TrainConfig
from ...models.wrappers import unwrap

Batch = dict[str, torch.Tensor]


class Stage:
    rows_per_sample = 1
    """Model rows per data sample (a preference pair is two: chosen and rejected)."""
    metric_keys: tuple[str, ...] = ("lm loss",)
    """What the loss function reports per micro-batch, averaged over micro-batches and data-parallel ranks; the
    first is the loss."""
    updates_per_step = 1
    """Optimizer steps per iteration on the batches ``prepare`` returns (GRPO's policy updates per rollout)."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.trainer: Any = None

    def setup(self, trainer) -> None:
        """Called once the trainer's model and starting checkpoint are in place."""
        self.trainer = trainer

    def prepare(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        """This step's micro-batches, before the schedule runs (collective on all ranks). The default keeps them
        lazy: a neat-packed micro-batch's attention mask is [b, 1, s, s]."""
        return batches

    def step_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """The step's averaged loss-function metrics plus what the stage measured itself (rollout figures)."""
        return metrics

    def forward_step(self, data_iterator, model):
        """Megatron's forward-step function: (output tensor, loss function of that output)."""
        raise NotImplementedError


def model_inputs(trainer, model, batch: Batch) -> tuple:
    """(tokens, positions, attention mask) of ``batch`` on the device, as the model's forward takes them."""
    from ...models.gpt import rope_positions

    device = trainer.backend.torch_device
    tokens = batch["tokens"].to(device)  # token ids were checked on the host (micro_batches)
    position_ids = batch.get("position_ids")
    if position_ids is None:
        position_ids = torch.arange(tokens.shape[1]).unsqueeze(0).expand_as(tokens)
    attention_mask = batch.get("attention_mask")
    return (tokens, rope_positions(unwrap(model), position_ids.to(device)),
            attention_mask.to(device) if attention_mask is not None else None)


def per_token_loss(trainer, model, batch: Batch, real_vocab_only: bool = False) -> torch.Tensor:
    """The model's per-token cross-entropy [b, s] of ``batch["labels"]`` (vocab-parallel under TP; on the last
    pipeline stage, a hidden-state tensor elsewhere).

    ``real_vocab_only`` leaves the padding rows of the vocabulary (``paddedVocabSize`` beyond ``vocabSize``) out
    of the softmax, so the probabilities are the HuggingFace model's: Megatron's own loss normalises over the
    padded vocabulary, which converted checkpoints fill with copies of a real row."""
    device = trainer.backend.torch_device
    args = model_inputs(trainer, model, batch)
    labels = batch["labels"].to(device)
    if not real_vocab_only:
        return model(*args, labels=labels)
    from megatron.core import parallel_state

    logits = model(*args)
    if not parallel_state.is_pipeline_last_stage():
        return logits
    return real_vocab_cross_entropy(logits, labels, trainer.cfg.model.vocabSize)


def real_vocab_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Vocab-parallel cross-entropy [b, s] of this rank's logit columns [b, s, v/tp], padding columns masked."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    part = logits.shape[-1]
    first = parallel_state.get_tensor_model_parallel_rank() * part
    padding = torch.arange(first, first + part, device=logits.device) >= vocab_size
    logits = logits.float().masked_fill(padding, float("-inf"))
    return vocab_parallel_cross_entropy(logits, labels)  # any leading dims: [b, s] here
