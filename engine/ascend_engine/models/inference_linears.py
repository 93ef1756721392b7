"""Megatron-core's tensor-parallel linears without their autograd wrappers, for inference.

``ColumnParallelLinear`` and ``RowParallelLinear`` route their local product through a ``torch.autograd.Function``
(``LinearWithGradAccumulationAndAsyncCommunication`` or ``LinearWithFrozenWeight``) that saves tensors for a
backward pass and carries gradient-communication settings. Under ``inference_mode`` there is no backward, and
without sequence parallelism that function's forward is only the local ``x @ W^T + b`` (the tensor-parallel
copies, gathers and reductions are done by the modules' ``forward`` around it, which stays megatron-core's). While
the context is open each such linear's ``_forward_impl`` is that very product, the same ``torch.matmul`` on the
same operands, so the numbers are bitwise those of megatron-core's path; a decode step saves a Python autograd
round trip per linear.

(On CPU, multiplying a decode step's few rows weight-major, ``(W @ x^T)^T``, ran MKL's sgemm 1.4-2.3x faster at
4-16 rows, but its sums differ in the last bits at some row counts, enough to flip a near-tie greedy token of a
tiny test model at TP2; parity comes first, so the product here is megatron-core's.)
"""
from __future__ import annotations

from contextlib import contextmanager

import torch


def _product(input, weight, bias=None, **_backward_only):
    """The forward of megatron-core's linear autograd functions (their other arguments concern the backward)."""
    output = torch.matmul(input, weight.t())
    return output if bias is None else output + bias


@contextmanager
def direct_linears(gpt):
    """Inside ``torch.inference_mode``: the local (not sequence-parallel) TP linears of ``gpt`` compute their
    product without an autograd function until the context closes."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    if not torch.is_inference_mode_enabled():
        raise RuntimeError("direct_linears is for inference_mode only: it drops the linears' backward")
    linears = [m for m in gpt.modules()
               if isinstance(m, (ColumnParallelLinear, RowParallelLinear)) and not m.sequence_parallel]
    for module in linears:
        module._forward_impl = _product  # the instance attribute shadows the class's method
    try:
        yield
    finally:
        for module in linears:
            del module._forward_impl
