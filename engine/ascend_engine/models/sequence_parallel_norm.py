"""Sequence parallelism with megatron-core's plain torch norms (no TransformerEngine or Apex, as on CPU).

megatron-core's ``WrappedTorchNorm`` refuses sequence parallelism: with it each tensor-parallel rank normalises
its own slice of the sequence, so a norm's weight gradient is partial per rank and must be summed over TP.
Megatron does that sum for every parameter marked ``sequence_parallel`` (as its fused norms are); the norm here
is the same torch norm with that mark. MoE layers need it: megatron-core refuses to train MoE with TP > 1 unless
sequence parallelism is on.
"""
from __future__ import annotations

import dataclasses

import torch


class SequenceParallelTorchNorm:
    """Drop-in for ``WrappedTorchNorm`` in a layer spec (same constructor, same state-dict keys)."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
                zero_centered_gamma: bool = False, normalization: str = "LayerNorm"):
        norm_cls = torch.nn.RMSNorm if config.normalization == "RMSNorm" else torch.nn.LayerNorm
        norm = norm_cls(normalized_shape=hidden_size, eps=eps)
        for param in norm.parameters():
            param.sequence_parallel = config.sequence_parallel
        return norm


def with_sequence_parallel_norms(spec):
    """A copy of a layer or block spec whose ``WrappedTorchNorm`` entries are ``SequenceParallelTorchNorm``."""
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    def swap(obj):
        if obj is WrappedTorchNorm:
            return SequenceParallelTorchNorm
        if isinstance(obj, list):
            return [swap(x) for x in obj]
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return dataclasses.replace(obj, **{f.name: swap(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                                               if f.init})
        return obj

    return swap(spec)
