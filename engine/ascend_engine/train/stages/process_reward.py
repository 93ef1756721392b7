"""prm: a process reward model, token classification at the step placeholders.

The model is the language model itself. At each position whose (unshifted) label is a reward token, the logits
of the reward-token columns alone (e.g. "+" and "-") are a classifier over the step's verdict: the loss is their
cross-entropy against the label, averaged over the micro-batch's placeholders, and the step accuracy the share of
placeholders whose largest reward-token logit is the label's (MindSpeed-LLM's PRM trainer). Under TP each rank
holds a slice of the vocabulary's columns; the few reward columns are assembled by one all-reduce of the
placeholders' [n, k] logits, each rank filling the columns it owns (the backward is the identity, so each rank's
own columns get their gradient). Only the last pipeline stage has logits.
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from ...config.loader import ConfigError
from .base import Batch, Stage, model_inputs


def reward_columns(logits: torch.Tensor, reward_ids: torch.Tensor) -> torch.Tensor:
    """[n, k] logits of the reward tokens from this rank's vocabulary slice [n, v/tp], whole on every rank."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import reduce_from_tensor_model_parallel_region

    part = logits.shape[-1]
    first = parallel_state.get_tensor_model_parallel_rank() * part
    local = (reward_ids >= first) & (reward_ids < first + part)
    picked = logits[:, (reward_ids - first).clamp(0, part - 1)].float()
    picked = torch.where(local, picked, torch.zeros_like(picked))
    if parallel_state.get_tensor_model_parallel_world_size() == 1:
        return picked
    return reduce_from_tensor_model_parallel_region(picked)


def step_classification_loss(reward_ids: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor,
                             logits: torch.Tensor):
    at = loss_mask.bool()
    matches = labels[at].unsqueeze(1) == reward_ids
    if not bool(matches.any(dim=1).all()):
        stray = sorted(set(labels[at][~matches.any(dim=1)].tolist()))
        raise ValueError(f"stage prm: the data labels tokens {stray} at placeholders, which are not among "
                         f"preference.rewardTokens (ids {reward_ids.tolist()}); prepare the data with the same "
                         "--reward-tokens as the run")
    columns = reward_columns(logits[at], reward_ids)
    target = matches.float().argmax(dim=1)  # the label's index among the reward tokens
    loss = F.cross_entropy(columns, target) if len(target) else columns.sum() * 0.0
    accuracy = (columns.argmax(dim=1) == target).float().mean() if len(target) else loss.detach() * 0.0
    # clone: the schedule divides the returned loss in place by the number of micro-batches
    return loss, {"lm loss": loss.detach().clone(), "steps/accuracy": accuracy.detach()}


class ProcessRewardStage(Stage):
    metric_keys = ("lm loss", "steps/accuracy")

    def setup(self, trainer) -> None:
        super().setup(trainer)
        self.reward_ids = torch.tensor(reward_token_ids(self.cfg), device=trainer.backend.torch_device)

    def forward_step(self, data_iterator, model):
        batch: Batch = next(data_iterator)
        device = self.trainer.backend.torch_device
        output = model(*model_inputs(self.trainer, model, batch))
        labels, mask = batch["labels"].to(device), batch["loss_mask"].to(device)
        return output, partial(step_classification_loss, self.reward_ids, labels, mask)


def reward_token_ids(cfg) -> list[int]:
    """``preference.rewardTokens`` as ids of the run's tokenizer, each exactly one token."""
    from transformers import AutoTokenizer

    path = cfg.data.tokenizerNameOrPath
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    ids = []
    for token in cfg.preference.rewardTokens:
        encoded = tokenizer.encode(token, add_special_tokens=False)
        if len(encoded) != 1:
            raise ConfigError(f"preference.rewardTokens: {token!r} is {len(encoded)} tokens of the tokenizer in "
                              f"{path}, not one")
        if encoded[0] >= cfg.model.vocabSize:
            raise ConfigError(f"preference.rewardTokens: {token!r} is token {encoded[0]}, beyond model.vocabSize "
                              f"{cfg.model.vocabSize}")
        ids.append(encoded[0])
    return ids
