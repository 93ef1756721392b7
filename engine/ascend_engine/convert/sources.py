"""Checkpoints seen as one unsplit Megatron-core model: ``load(key)`` gives the whole tensor for a global key.

Every direction goes through this form: HF tensors are mapped into it by the family table, Megatron shards
are merged into it, a LoRA adapter is folded into it. ``meta=True`` gives shape-only tensors without reading
data, which is how a conversion is checked end to end before anything is written.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..config.model import ModelConfig
from .errors import reason
from .families import Family, MappingError, to_mcore
from .hf_config import family_for, model_config_from_hf
from .lora import LoraAdapter
from .mcore_layout import EMBEDDING, OUTPUT
from .megatron_io import MegatronReader
from .safetensors_io import SafetensorsError, SafetensorsReader

# Buffers some HF checkpoints carry that are recomputed, never learned.
_IGNORED_HF_SUFFIXES = (".rotary_emb.inv_freq",)


def read_hf_config(directory: str | Path) -> dict:
    path = Path(directory) / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise SafetensorsError(f"{path}: missing (an HF checkpoint needs its config.json)") from None
    except (OSError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: unreadable ({reason(e)})") from None


class HFSource:
    """An HF directory through its family's mapping table."""

    def __init__(self, directory: str, requested_family: str | None, make_vocab_size_divisible_by: int,
                 padded_vocab_size: int | None):
        self.directory = Path(directory)
        hf = read_hf_config(self.directory)
        where = str(self.directory / "config.json")
        self.family: Family = family_for(hf, requested_family, where)
        self.model: ModelConfig = model_config_from_hf(hf, where, make_vocab_size_divisible_by, padded_vocab_size)
        self.reader = SafetensorsReader(self.directory)
        self.plan = self.family.rows_for(self.model)
        used = {name for _, _, names in self.plan.values() for name in names}
        extra = sorted(n for n in self.reader.names() if n not in used and not n.endswith(_IGNORED_HF_SUFFIXES))
        if extra:
            raise MappingError(f"{self.directory}: {len(extra)} tensors that the {self.family.name} mapping does not "
                               f"know (a feature the converter does not support?), e.g. {', '.join(extra[:3])}")
        self.args = None
        self.iteration = "release"

    def keys(self) -> list[str]:
        return list(self.plan)

    def load(self, key: str, meta: bool = False) -> np.ndarray:
        rule, _, names = self.plan[key]
        tensors = [self.reader.meta(n) if meta else self.reader.load(n) for n in names]
        return to_mcore(rule, tensors, self.model, key)


class MegatronSource:
    """A Megatron checkpoint directory, TP shards merged and layers numbered globally."""

    def __init__(self, root: str, iteration: int | None = None):
        self.reader = MegatronReader(root, iteration=iteration)
        self.model = self.reader.model
        self.args = self.reader.args
        self.iteration = self.reader.iteration
        self.layer_counts = self.reader.layer_counts

    def keys(self) -> list[str]:
        return self.reader.keys()

    def load(self, key: str, meta: bool = False) -> np.ndarray:
        return self.reader.load(key, meta)


class Unsplit:
    """What the writers read: a source with tied output weights resolved and an optional adapter merged."""

    def __init__(self, source, lora: LoraAdapter | None = None):
        self.source, self.lora = source, lora
        self.model: ModelConfig = source.model

    def get(self, key: str, meta: bool) -> np.ndarray:
        tied = key == OUTPUT and not self.model.untieEmbeddingsAndOutputWeights
        tensor = self.source.load(EMBEDDING if tied else key, meta)
        return self.lora.merge(key, tensor, meta) if self.lora else tensor
