"""pretrain / sft: the next-token loss averaged over the tokens the loss mask keeps (responses, for SFT)."""
from __future__ import annotations

from functools import partial

import torch

from .base import Stage, per_token_loss


def masked_mean_loss(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    losses = output_tensor.float()
    mask = loss_mask.float()
    loss = (losses * mask).sum() / mask.sum().clamp(min=1)
    # clone: the schedule divides the returned loss in place by the number of micro-batches
    return loss, {"lm loss": loss.detach().clone()}


class LanguageModelStage(Stage):
    def forward_step(self, data_iterator, model):
        batch = next(data_iterator)
        output = per_token_loss(self.trainer, model, batch)
        return output, partial(masked_mean_loss, batch["loss_mask"].to(self.trainer.backend.torch_device))
