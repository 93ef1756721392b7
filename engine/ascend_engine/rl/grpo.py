"""GRPO's group-normalised advantages and its clipped, KL-penalised token loss (pure tensor functions).

Semantics follow MindSpeed-RL's ``grpo`` estimator and actor loss: a response's advantage is its reward minus the
mean of its group (the ``n_samples_per_prompt`` responses to one prompt) over the group's standard deviation
(unbiased, as ``torch.std``) plus ``eps``; every response token carries it. The per-token loss is PPO's clipped
surrogate ``max(-A r, -A clip(r, 1-c, 1+c))`` with ``r = exp(logp - logp_old)`` plus ``kl_coef`` times the k3
("low variance") estimate of KL(policy || reference), ``exp(ref - logp) - (ref - logp) - 1``, clamped to
[-10, 10] as MindSpeed-RL does. Aggregation is ``token_mean`` (all response tokens of the batch weigh the same,
MindSpeed-RL's default) or ``sequence_mean`` (the mean over each response, then over responses, as in the
DeepSeekMath paper).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Aggregation = Literal["token_mean", "sequence_mean"]


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """[n] rewards, ordered as consecutive groups of ``group_size`` -> [n] advantages (computed in float64,
    returned in the rewards' floating dtype, float32 for integer rewards).

    A group of one has no spread: its advantage is 0 (nothing to learn from a lone sample).
    """
    if rewards.dim() != 1 or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    groups = rewards.double().view(-1, group_size)
    if group_size == 1:
        return torch.zeros_like(rewards, dtype=dtype)
    normalised = (groups - groups.mean(dim=1, keepdim=True)) / (groups.std(dim=1, keepdim=True) + eps)
    return normalised.view(-1).to(dtype)


def k3_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference): non-negative, unbiased, low variance; clamped to [-10, 10]."""
    diff = ref_log_probs - log_probs
    return (torch.exp(diff) - diff - 1).clamp(-10, 10)


def aggregate(values: torch.Tensor, mask: torch.Tensor, how: Aggregation) -> torch.Tensor:
    """Mean of [b, T] ``values`` over the True entries of ``mask``: per token, or per sequence then over rows."""
    mask = mask.to(values.dtype)
    if how == "token_mean":
        return (values * mask).sum() / mask.sum().clamp(min=1)
    if how == "sequence_mean":
        per_row = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        return per_row[mask.sum(-1) > 0].mean() if bool((mask.sum(-1) > 0).any()) else values.new_zeros(())
    raise ValueError(f"unknown aggregation {how!r}: expected token_mean or sequence_mean")


@dataclass
class GrpoLoss:
    """The loss to back-propagate and what to log about it (detached)."""

    loss: torch.Tensor
    policy_loss: torch.Tensor
    kl: torch.Tensor
    clip_fraction: torch.Tensor
    approx_kl_to_old: torch.Tensor


def grpo_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, *, clip_ratio: float = 0.2, kl_coef: float = 0.0,
              ref_log_probs: torch.Tensor | None = None, aggregation: Aggregation = "token_mean") -> GrpoLoss:
    """GRPO loss over response tokens.

    ``log_probs`` [b, T] (with grad) are the current policy's log-probabilities of the sampled tokens,
    ``old_log_probs`` those at rollout time, ``advantages`` [b] (one per response) or [b, T], ``mask`` [b, T]
    True at response tokens. ``ref_log_probs`` is required when ``kl_coef`` > 0.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(log_probs)
    ratio = torch.exp(log_probs - old_log_probs)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio, 1.0 + clip_ratio)
    policy = aggregate(torch.maximum(unclipped, clipped), mask, aggregation)
    loss = policy
    kl = log_probs.new_zeros(())
    if kl_coef:
        if ref_log_probs is None:
            raise ValueError("kl_coef > 0 needs the reference model's log-probs (ref_log_probs)")
        kl = aggregate(k3_kl(log_probs, ref_log_probs), mask, aggregation)
        loss = loss + kl_coef * kl
    elif ref_log_probs is not None:
        kl = aggregate(k3_kl(log_probs, ref_log_probs), mask, aggregation).detach()
    with torch.no_grad():
        clip_fraction = aggregate((clipped > unclipped).float(), mask, "token_mean")
        approx_kl = aggregate(old_log_probs - log_probs, mask, "token_mean")
    return GrpoLoss(loss=loss, policy_loss=policy.detach(), kl=kl.detach(), clip_fraction=clip_fraction,
                    approx_kl_to_old=approx_kl)


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log p(tokens[:, t]) from [b, T, V] ``logits`` in which logits[:, t] predicts tokens[:, t] (already shifted)."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
