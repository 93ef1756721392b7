"""LoRA adapters on Megatron's tensor-parallel linear layers, saved under PEFT's names.

Each targeted layer keeps its weight (frozen) and gains ``lora_A.default.weight`` [r, in] and
``lora_B.default.weight`` [out, r]; a forward hook adds ``(alpha / r) * B(A(dropout(x)))`` to its output. The
state-dict keys are what MindSpeed-LLM's PEFT-wrapped models save and what ``ascend-engine convert`` merges.

Tensor parallelism follows the base layer. Column-parallel layers (linear_qkv, linear_fc1) see the whole input
and own a slice of the output rows, so A is whole and B holds this rank's rows (for the fused SwiGLU fc1 that
is [gate_i; up_i], like the weight); the rank-r activation goes through Megatron's copy-to-TP region so A's
gradient sums every rank's part. Row-parallel layers (linear_proj, linear_fc2) see a slice of the input, so
A holds the matching input columns, the rank-r activation is all-reduced, and B is whole.

With sequence parallelism a column-parallel layer's input is this rank's slice of the sequence: it is gathered
for A (the gather's backward reduce-scatters the input gradient), and A, whose gradient is then partial per
rank, is marked ``sequence_parallel`` so Megatron all-reduces it over TP as it does for norms. A row-parallel
layer's rank-r activation is reduce-scattered over the sequence instead of all-reduced, and B is marked alike.

Initialisation is PEFT's (A uniform in +-1/sqrt(in), B zero, so training starts from the base model) and, like
``init.py``, drawn whole per global name so any TP/PP layout gets the same adapter.
"""
from __future__ import annotations

import contextlib
import zlib

import torch
import torch.nn.functional as F
from torch import nn

from ..config.train import LoraConfig
from .init import global_names

ADAPTER_KEY = ".lora_"


def is_adapter_key(key: str) -> bool:
    return ADAPTER_KEY + "A." in key or ADAPTER_KEY + "B." in key


def _param(shape: tuple[int, ...], dtype: torch.dtype, parallel_dim: int | None) -> nn.Parameter:
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

    p = nn.Parameter(torch.zeros(shape, dtype=dtype))
    if parallel_dim is not None:
        set_tensor_model_parallel_attributes(p, True, parallel_dim, 1)
    return p


def _holder(weight: nn.Parameter) -> nn.ModuleDict:
    module = nn.Module()
    module.weight = weight
    return nn.ModuleDict({"default": module})


class _Adapter:
    """The forward hook of one layer (kept out of the module tree, so it adds no state-dict keys)."""

    def __init__(self, column: bool, scale: float, dropout: float, sequence_parallel: bool):
        self.column, self.scale, self.dropout, self.sequence_parallel = column, scale, dropout, sequence_parallel

    def __call__(self, module, args, output):
        from megatron.core.tensor_parallel import (copy_to_tensor_model_parallel_region,
                                                   gather_from_sequence_parallel_region, get_cuda_rng_tracker,
                                                   reduce_from_tensor_model_parallel_region,
                                                   reduce_scatter_to_sequence_parallel_region)

        if getattr(module, "lora_disabled", False):
            return output
        x = args[0]
        if self.column and self.sequence_parallel:
            x = gather_from_sequence_parallel_region(x)
        a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
        if self.dropout and module.training:
            if self.column:  # the same input on every TP rank: the same mask everywhere
                x = F.dropout(x, self.dropout)
            else:  # this rank's slice of the input: its own mask
                with get_cuda_rng_tracker().fork():
                    x = F.dropout(x, self.dropout)
        h = F.linear(x, a)
        if self.column:
            h = h if self.sequence_parallel else copy_to_tensor_model_parallel_region(h)
        else:
            h = (reduce_scatter_to_sequence_parallel_region(h) if self.sequence_parallel
                 else reduce_from_tensor_model_parallel_region(h))
        out, bias = output
        return out + self.scale * F.linear(h, b), bias


def add_lora(gpt, lora: LoraConfig, seed: int, tp: int, tp_rank: int) -> int:
    """Freeze ``gpt`` and attach adapters to the targeted layers of this stage; returns how many were added."""
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    for p in gpt.parameters():
        p.requires_grad_(False)
    r, scale = lora.loraR, lora.loraAlpha / lora.loraR
    names = {}
    for name, module in gpt.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf not in lora.loraTargetModules:
            continue
        column = isinstance(module, ColumnParallelLinear)
        if not column and not isinstance(module, RowParallelLinear):
            raise TypeError(f"{name}: LoRA needs a tensor-parallel linear layer, found {type(module).__name__}")
        dtype = module.weight.dtype
        if column:
            a = _param((r, module.input_size), dtype, None)
            b = _param((module.output_size_per_partition, r), dtype, 0)
        else:
            a = _param((r, module.input_size_per_partition), dtype, 1)
            b = _param((module.output_size, r), dtype, None)
        sequence_parallel = bool(getattr(module, "sequence_parallel", False))
        if sequence_parallel:  # the replicated half gets partial gradients per rank: Megatron all-reduces it
            (a if column else b).sequence_parallel = True
        module.lora_A, module.lora_B = _holder(a), _holder(b)
        module.register_forward_hook(_Adapter(column, scale, lora.loraDropout, sequence_parallel))
        names[name] = (a, column)
    whole = global_names(gpt)
    with torch.no_grad():
        for name, (a, column) in names.items():
            key = whole[f"{name}.lora_A.default.weight"]
            fan_in = a.shape[1] * (1 if column else tp)
            gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(key.encode()))
            full = torch.empty(a.shape[0], fan_in).uniform_(-fan_in ** -0.5, fan_in ** -0.5, generator=gen)
            a.copy_(full if column else full.chunk(tp, dim=1)[tp_rank])
    return len(names)


@contextlib.contextmanager
def adapters_disabled(gpt):
    """The base model alone while inside (the LoRA-DPO reference): every adapter hook passes its layer through."""
    layers = [m for m in gpt.modules() if hasattr(m, "lora_A")]
    for m in layers:
        m.lora_disabled = True
    try:
        yield gpt
    finally:
        for m in layers:
            m.lora_disabled = False


def adapter_state(state: dict) -> dict:
    """Only the adapter tensors of a model state dict (what a LoRA checkpoint holds)."""
    return {k: v for k, v in state.items() if is_adapter_key(k)}
