"""Merge a LoRA adapter into base weights: W' = W + (alpha / r) * B @ A, computed in fp32.

The adapter is a Megatron checkpoint as LoRA fine-tuning saves it (MindSpeed-LLM / PEFT names:
``decoder.layers.0.self_attention.linear_qkv.lora_A.default.weight``), with its own TP/PP layout: column-parallel
targets (linear_qkv, linear_fc1) split B like the weight, row-parallel ones (linear_proj, linear_fc2) split A
along its input. The reader merges both to whole matrices, so B @ A is the whole weight's update.
"""
from __future__ import annotations

import re

import numpy as np

from ..config.model import ModelConfig
from .arrays import dense
from .errors import ConvertError
from .megatron_io import MegatronReader

_LORA_KEY = re.compile(r"^(decoder\.layers\.(\d+)\..*\.(linear_qkv|linear_proj|linear_fc1|linear_fc2))\.lora_([AB])"
                       r"\.weight$")


class LoraError(ConvertError):
    """An adapter that does not fit the base model or the given rank/targets."""


class LoraAdapter:
    def __init__(self, path: str, base: ModelConfig, r: int, alpha: float, targets: list[str]):
        self.reader = MegatronReader(path, lora=True)
        self.scale = alpha / r
        modules: dict[str, dict[str, str]] = {}
        for key in self.reader.keys():
            m = _LORA_KEY.match(key)
            if not m:
                raise LoraError(f"{path}: unexpected LoRA tensor {key}")
            modules.setdefault(m.group(1), {})[m.group(4)] = key
        if not modules:
            raise LoraError(f"{path}: no LoRA tensors (lora_A / lora_B) in the checkpoint")
        found = sorted({m.rsplit(".", 1)[1] for m in modules})
        if found != sorted(targets):
            raise LoraError(f"{path}: adapter targets {found}, but loraTargetModules is {sorted(targets)}")
        layers = {int(_LORA_KEY.match(k + ".lora_A.weight").group(2)) for k in modules}
        if layers != set(range(base.numLayers)):
            raise LoraError(f"{path}: adapter covers layers {sorted(layers)}, the base model has {base.numLayers}")
        self.modules = {}
        for module, pair in modules.items():
            if set(pair) != {"A", "B"}:
                raise LoraError(f"{path}: {module} has lora_{''.join(pair)} only")
            a, b = (self.reader.load(pair[x], meta=True) for x in "AB")
            if a.shape[0] != r or b.shape[1] != r:
                raise LoraError(f"{path}: {module} has rank {a.shape[0]} (A {tuple(a.shape)}, B {tuple(b.shape)}), "
                                f"but loraR is {r}")
            self.modules[module + ".weight"] = pair

    def merge(self, key: str, weight: np.ndarray, meta: bool) -> np.ndarray:
        """``weight`` with the adapter's update added when ``key`` is a targeted weight."""
        pair = self.modules.get(key)
        if pair is None:
            return weight
        a, b = (self.reader.load(pair[x], meta=meta) for x in "AB")
        if (b.shape[0], a.shape[1]) != tuple(weight.shape):
            raise LoraError(f"{self.reader.root}: B @ A for {key} is {(b.shape[0], a.shape[1])}, the weight is "
                            f"{tuple(weight.shape)}")
        if meta:
            return weight
        f32, weight = np.float32, dense(weight)
        update = np.float32(self.scale) * (b.astype(f32) @ a.astype(f32))
        return (weight.astype(f32) + update).astype(weight.dtype)

    def unused(self, keys: set[str]) -> list[str]:
        return sorted(k for k in self.modules if k not in keys)

