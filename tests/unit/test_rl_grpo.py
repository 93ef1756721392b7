"""GRPO's advantages and loss against independent computations (numpy group statistics, hand-derived gradients)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ascend_engine.rl.grpo import group_advantages, grpo_loss, k3_kl, token_log_probs


def test_advantages_equal_an_independent_numpy_group_normalisation():
    rng = np.random.default_rng(0)
    rewards = rng.choice([0.0, 0.5, 1.0], size=24)
    rewards[:4] = 1.0  # a group where every sample is right: no signal, advantage 0
    ours = group_advantages(torch.tensor(rewards), group_size=4).numpy()
    expected = []
    for group in rewards.reshape(6, 4):
        expected += list((group - group.mean()) / (group.std(ddof=1) + 1e-6))
    np.testing.assert_allclose(ours, np.array(expected), rtol=1e-6, atol=1e-6)
    assert np.all(ours[:4] == 0)
    assert np.allclose(ours.reshape(6, 4).sum(1), 0, atol=1e-5)


def test_advantages_edge_cases():
    assert group_advantages(torch.tensor([1.0, 0.0]), group_size=1).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="5 rewards do not split into groups of 2"):
        group_advantages(torch.ones(5), group_size=2)


def _toy(seed=0, b=4, t=5, v=7):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, t, v, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, v, (b, t), generator=g)
    lengths = torch.tensor([5, 3, 1, 4])
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    return logits, tokens, mask, rewards, lengths


def _reinforce_gradient(logits, tokens, mask, weights):
    """d/dlogits of -sum_{i,t} w_i,t log p(y_i,t): each masked token contributes -w (onehot(y) - softmax)."""
    x = logits.numpy()
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    onehot = np.eye(x.shape[-1])[tokens.numpy()]
    return -(weights * mask.numpy())[..., None] * (onehot - p)


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean"])
def test_gradient_with_ratio_one_and_no_kl_is_reinforce_with_a_group_baseline(aggregation):
    logits, tokens, mask, rewards, lengths = _toy()
    advantages = group_advantages(rewards, group_size=4)
    leaf = logits.clone().requires_grad_(True)
    log_probs = token_log_probs(leaf, tokens)
    out = grpo_loss(log_probs, log_probs.detach(), advantages, mask, clip_ratio=0.2, kl_coef=0.0,
                    aggregation=aggregation)
    out.loss.backward()
    baseline = rewards.mean()
    std = rewards.std()  # unbiased, as the group normalisation
    a = ((rewards - baseline) / (std + 1e-6)).numpy()[:, None]
    if aggregation == "token_mean":
        weights = np.broadcast_to(a / mask.sum().item(), mask.shape)
    else:
        weights = np.broadcast_to(a / (len(rewards) * lengths.numpy()[:, None]), mask.shape)
    np.testing.assert_allclose(leaf.grad.numpy(), _reinforce_gradient(logits, tokens, mask, weights),
                               rtol=1e-10, atol=1e-12)
    assert out.clip_fraction.item() == 0.0
    assert abs(out.approx_kl_to_old.item()) == 0.0


def test_clipping_stops_the_gradient_of_tokens_beyond_the_trust_region():
    logits, tokens, mask, _, _ = _toy(seed=1)
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    leaf = logits.clone().requires_grad_(True)
    log_probs = token_log_probs(leaf, tokens)
    # old log-probs chosen so the ratio is 1.5 on row 0 (A > 0: clipped), 0.5 on row 1 (A < 0: clipped),
    # 0.5 on row 2 (A > 0: not clipped, the max keeps the unclipped, larger loss) and 1.0 on row 3
    shift = torch.log(torch.tensor([1.5, 0.5, 0.5, 1.0], dtype=torch.float64)).unsqueeze(1)
    old = log_probs.detach() - shift
    out = grpo_loss(log_probs, old, advantages, mask, clip_ratio=0.2)
    out.loss.backward()
    grad_rows = leaf.grad.abs().sum(dim=(1, 2))
    assert grad_rows[0] == 0 and grad_rows[1] == 0
    assert grad_rows[2] > 0 and grad_rows[3] > 0
    n = mask.sum().item()
    assert out.clip_fraction.item() == pytest.approx((mask[0].sum() + mask[1].sum()).item() / n)
    # the loss value: rows 0/1 use the clipped ratio, rows 2/3 the raw one
    per_row = torch.tensor([-1.2, 0.8, -0.5, 1.0], dtype=torch.float64)
    assert out.loss.item() == pytest.approx((per_row[:, None] * mask).sum().item() / n)


def test_k3_kl_penalty_value_and_gradient():
    logits, tokens, mask, _, _ = _toy(seed=2)
    ref = token_log_probs(logits + 0.3 * torch.randn(logits.shape, generator=torch.Generator().manual_seed(3),
                                                     dtype=torch.float64), tokens)
    leaf = logits.clone().requires_grad_(True)
    log_probs = token_log_probs(leaf, tokens)
    zero_adv = torch.zeros(4, dtype=torch.float64)
    out = grpo_loss(log_probs, log_probs.detach(), zero_adv, mask, kl_coef=0.5, ref_log_probs=ref)
    lp, r = log_probs.detach().numpy(), ref.numpy()
    k3 = np.exp(r - lp) - (r - lp) - 1
    m = mask.numpy()
    assert out.kl.item() == pytest.approx((k3 * m).sum() / m.sum())
    assert out.loss.item() == pytest.approx(0.5 * (k3 * m).sum() / m.sum())
    assert np.all(k3 >= 0)
    out.loss.backward()
    dk3_dlp = 1 - np.exp(r - lp)  # d/dlogp of exp(ref - logp) - (ref - logp) - 1
    expected = _reinforce_gradient(logits, tokens, mask, -0.5 * dk3_dlp / m.sum())
    np.testing.assert_allclose(leaf.grad.numpy(), expected, rtol=1e-9, atol=1e-12)
    assert k3_kl(torch.zeros(3), torch.zeros(3)).tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="ref_log_probs"):
        grpo_loss(log_probs, log_probs.detach(), zero_adv, mask, kl_coef=0.1)
