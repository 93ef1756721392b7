"""Megatron-core's tensor-parallel linears without their autograd wrappers, for inference.

``ColumnParallelLinear`` and ``RowParallelLinear`` route their local product through a ``torch.autograd.Function``
(``LinearWithGradAccumulationAndAsyncCommunication`` or ``LinearWithFrozenWeight``) that saves tensors for a
backward pass and carries gradient-communication settings. Under ``inference_mode`` there is no backward, and
without sequence parallelism that function's forward is only the local ``x @ W^T + b`` (the tensor-parallel
copies, gathers and reductions are done by the modules' ``forward`` around it, which stays megatron-core's). While
the context is open each such linear's ``_forward_impl`` is that very product, the same ``torch.matmul`` on the
same operands, so the numbers are bitwise those of megatron-core's path; a decode step saves a Python autograd
round trip per linear.

Each product runs in the kernel ``device.packed_linears`` picks for the weight (on CPU oneDNN on a copy of the
weight packed once per ``products`` table, elsewhere the plain product): its sums may differ from megatron-core's
``torch.matmul`` in the last bits, within inference's tolerance parity (docs/performance.md, Inference). A caller
whose weights stay fixed across many forwards (evaluation) makes the table once with ``packed_products`` and
passes it in; otherwise each ``direct_linears`` packs afresh (a GRPO rollout sees the weights of its step).
"""
from __future__ import annotations

import functools
from contextlib import contextmanager

import torch


def _linears(gpt) -> list:
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    return [m for m in gpt.modules()
            if isinstance(m, (ColumnParallelLinear, RowParallelLinear)) and not m.sequence_parallel]


def packed_products(gpt, rows: int = 16) -> dict[int, object]:
    """``id(weight) -> (x [n, in] -> x @ weight^T)`` for the weight of every local TP linear of ``gpt`` (the
    output layer's shared embedding weight included), in the device's kernel for about ``rows`` rows."""
    weights = {id(m.weight): m.weight for m in _linears(gpt) if m.weight is not None}
    shared = getattr(gpt, "shared_embedding_or_output_weight", None)
    if getattr(gpt, "post_process", False) and getattr(gpt, "output_layer", None) is not None and shared:
        weight = shared()
        if weight is not None:
            weights[id(weight)] = weight
    from ..device import packed_linears

    return dict(zip(weights, packed_linears(list(weights.values()), rows)))


def _product(input, weight, bias=None, *, products, **_backward_only):
    """The forward of megatron-core's linear autograd functions (their other arguments concern the backward)."""
    product = products.get(id(weight))
    if product is None:
        output = torch.matmul(input, weight.t())
    else:
        output = product(input.reshape(-1, input.shape[-1])).view(*input.shape[:-1], weight.shape[0])
    return output if bias is None else output + bias


@contextmanager
def direct_linears(gpt, products: dict | None = None):
    """Inside ``torch.inference_mode``: the local (not sequence-parallel) TP linears of ``gpt`` compute their
    product without an autograd function, in ``products``' kernels (made here if not given), until the context
    closes. Yields the products table."""
    if not torch.is_inference_mode_enabled():
        raise RuntimeError("direct_linears is for inference_mode only: it drops the linears' backward")
    if products is None:
        products = packed_products(gpt)
    linears = _linears(gpt)
    for module in linears:
        module._forward_impl = functools.partial(_product, products=products)  # shadows the class's method
    try:
        yield products
    finally:
        for module in linears:
            del module._forward_impl
