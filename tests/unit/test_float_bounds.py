"""The parity tests' float32 bound (tests/float_bounds.py): its arithmetic, and its premise checked on real sums."""
from __future__ import annotations

import pytest
import torch

from float_bounds import curve_atol, decided, delta, forward_atol, printed


@pytest.mark.parametrize("terms", [64, 256, 1024, 4096])
def test_two_orders_of_a_float32_matmul_differ_by_less_than_delta(terms):
    """A row-parallel linear at TP=2 sums two half products (an all-reduce) where one process sums one product:
    over 4096 outputs of random inputs, the two differ by less than delta(K, 1) = sqrt(K) x 2**-24 of the largest
    output (measured: up to 0.56 of it), the premise of every parity bound (one reduction; a forward chains D of
    them)."""
    g = torch.Generator().manual_seed(terms)
    x, w = torch.randn(64, terms, generator=g), torch.randn(terms, 64, generator=g)
    whole = x @ w
    half = terms // 2
    split = x[:, :half] @ w[:half] + x[:, half:] @ w[half:]
    exact = (x.double() @ w.double()).float()
    for got in (whole, split):
        assert (got - exact).abs().max() <= forward_atol(exact, delta(terms, 1))
    assert (whole - split).abs().max() <= forward_atol(whole, delta(terms, 1))


def test_a_training_curve_bound_grows_with_the_way_the_loss_travelled():
    d = 1e-6
    assert curve_atol([1.0, 0.5, 0.25], d) == pytest.approx([d * 1.0, d * 1.0, d * 1.0])
    assert curve_atol([1.0, 2.0, 1.0], d) == pytest.approx([d * 1.0, d * 3.0, d * 3.0])  # up and down both count
    assert curve_atol([0.0, 0.1], d, scale=5.0) == pytest.approx([d * 5.0, d * 5.2])
    assert curve_atol([0.5734913], d, from_log=True) == pytest.approx([d * 0.5734913 + 1e-7])


def test_printed_values_differ_by_their_last_digit():
    assert printed(4.891856) == pytest.approx(1e-6)
    assert printed(0.5734913) == pytest.approx(1e-7)
    assert printed(-3.2e-3) == pytest.approx(1e-9)
    assert printed(0.0) == 0.0


def test_only_a_clear_lead_decides_the_argmax():
    logits = torch.tensor([[1.0, 0.5, 0.0], [1.0, 1.0 - 1e-6, 0.0]])
    assert decided(logits, 1e-6).tolist() == [True, False]
