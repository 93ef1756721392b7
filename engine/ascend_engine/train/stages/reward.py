"""orm: an outcome reward model trained on preference pairs.

The model is the language model with a scalar score head in place of its output layer (``models/score_head.py``).
A reply's reward is the score at its last real token; each micro-batch holds ``m`` pairs as ``2m`` rows (chosen
first) and the loss is the pairwise ranking loss -log sigmoid(r_chosen - r_rejected) (Bradley-Terry, as
MindSpeed-LLM's and TRL's reward trainers), averaged over the pairs. Only the last pipeline stage has scores.
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from ...models.score_head import last_token_index
from .base import Batch, Stage, model_inputs


def sequence_rewards(scores: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Reward [b] of each row: its [b, s, 1] scores at the row's last real token."""
    index = last_token_index(loss_mask.to(scores.device))
    return scores[..., 0].float().gather(1, index.unsqueeze(1)).squeeze(1)


def pairwise_ranking_loss(loss_mask: torch.Tensor, scores: torch.Tensor):
    rewards = sequence_rewards(scores, loss_mask)
    chosen, rejected = rewards.chunk(2)
    loss = -F.logsigmoid(chosen - rejected).mean()
    chosen, rejected = chosen.detach(), rejected.detach()
    # clone: the schedule divides the returned loss in place by the number of micro-batches
    return loss, {"lm loss": loss.detach().clone(), "rewards/chosen": chosen.mean(),
                  "rewards/rejected": rejected.mean(), "rewards/margins": (chosen - rejected).mean(),
                  "rewards/accuracies": (chosen > rejected).float().mean()}


class RewardModelStage(Stage):
    rows_per_sample = 2
    metric_keys = ("lm loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")

    def forward_step(self, data_iterator, model):
        batch: Batch = next(data_iterator)
        output = model(*model_inputs(self.trainer, model, batch))
        return output, partial(pairwise_ranking_loss, batch["loss_mask"])
