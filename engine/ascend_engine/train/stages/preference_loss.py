"""DPO and SimPO objectives on sequence log-probabilities (pure tensor functions, no model).

DPO (Rafailov et al. 2023) with MindSpeed-LLM's loss types: ``sigmoid`` (with conservative label smoothing),
``hinge`` and ``ipo`` (which, as MindSpeed-LLM and TRL do, uses log-probabilities averaged over the reply's
tokens). SimPO (Meng et al. 2024): no reference; the reward is beta x the mean log-probability of the reply and
the pair must win by the margin gamma = gammaBetaRatio x beta.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...config.preference import PreferenceConfig


def sequence_logps(token_losses: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of log-probabilities over the kept tokens, number of kept tokens) per row of [b, s] cross-entropies."""
    mask = loss_mask.float()
    return -(token_losses.float() * mask).sum(-1), mask.sum(-1)


def _smoothed_sigmoid(logits: torch.Tensor, beta: float, smoothing: float) -> torch.Tensor:
    return -F.logsigmoid(beta * logits) * (1 - smoothing) - F.logsigmoid(-beta * logits) * smoothing


def dpo_losses(cfg: PreferenceConfig, chosen: torch.Tensor, rejected: torch.Tensor, ref_chosen: torch.Tensor,
               ref_rejected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, chosen reward, rejected reward) per pair; log-probabilities already length-normalised for ipo."""
    logits = (chosen - rejected) - (ref_chosen - ref_rejected)
    beta = cfg.dpoBeta
    if cfg.dpoLossType == "sigmoid":
        losses = _smoothed_sigmoid(logits, beta, cfg.dpoLabelSmoothing)
    elif cfg.dpoLossType == "hinge":
        losses = torch.relu(1 - beta * logits)
    else:  # ipo: beta is the regulariser tau of the IPO paper
        losses = (logits - 1 / (2 * beta)) ** 2
    return losses, beta * (chosen - ref_chosen).detach(), beta * (rejected - ref_rejected).detach()


def simpo_losses(cfg: PreferenceConfig, chosen_mean: torch.Tensor, rejected_mean: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, chosen reward, rejected reward) per pair from mean per-token log-probabilities."""
    logits = chosen_mean - rejected_mean - cfg.gammaBetaRatio
    beta = cfg.simpoBeta
    if cfg.simpoLossType == "sigmoid":
        losses = _smoothed_sigmoid(logits, beta, cfg.simpoLabelSmoothing)
    else:
        losses = torch.relu(1 - beta * logits)
    return losses, beta * chosen_mean.detach(), beta * rejected_mean.detach()
