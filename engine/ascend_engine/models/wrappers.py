"""The model inside Megatron's wrappers, for the trainer, its stages and checkpoints alike.

A module of its own, importing nothing: the stages are imported before the device backend is applied, which must
come before the first Megatron import (``device.Backend.apply``).
"""
from __future__ import annotations


def unwrap(module):
    """The GPTModel inside DDP / Float16Module wrappers."""
    while hasattr(module, "module"):
        module = module.module
    return module
