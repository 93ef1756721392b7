"""Megatron checkpoints (``iter_*/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt``) as one unsplit model, lazily.

``MegatronReader`` opens every rank file of one iteration (the latest by default) without reading tensor data and serves
whole (TP-merged, layers and experts globally numbered) tensors on request. ``checkpoint_args`` makes the ``args`` namespace
Megatron-LM and MindSpeed-LLM read the model shape from.
"""
from __future__ import annotations

import argparse
import copy
import re
from pathlib import Path

import numpy as np

from ..checkpoint.layout import MODEL_FILE, RELEASE, checkpoint_file, iteration_dir, rank_dir_name, read_latest
from ..checkpoint.megatron_args import moe_args, moe_fields_from_args
from ..config.model import ModelConfig
from .mcore_layout import expert_to_global, split_expert_key, split_kind, split_layer_key, with_layer
from .tensor_parallel import merge
from .dtypes import BFLOAT16, FLOAT16
from .torch_file import CheckpointFileError, LazyTensor, LazyTorchFile, torch_dtype

CHECKPOINT_VERSION = 3.0


def _normalize(key: str) -> str:
    """Names a PEFT-wrapped model saves (``linear_qkv.base_layer.weight``, ``lora_A.default.weight``) ->
    plain local-spec names."""
    return re.sub(r"\.lora_([AB])\.default\.", r".lora_\1.", key.replace(".base_layer.", "."))


def is_lora_key(key: str) -> bool:
    return ".lora_A." in key or ".lora_B." in key


def model_config_from_args(args: argparse.Namespace, source: str) -> ModelConfig:
    """Read the model shape the way Megatron-LM's own ``args`` spell it."""
    def get(name, default=None):
        value = getattr(args, name, default)
        return default if value is None else value

    try:
        heads = int(args.num_attention_heads)
        return ModelConfig(
            numLayers=int(args.num_layers), hiddenSize=int(args.hidden_size),
            ffnHiddenSize=get("ffn_hidden_size"), numAttentionHeads=heads,
            groupQueryAttention=bool(get("group_query_attention", False)), numQueryGroups=get("num_query_groups"),
            kvChannels=get("kv_channels"), maxPositionEmbeddings=get("max_position_embeddings"),
            vocabSize=int(get("vocab_size", args.padded_vocab_size)), paddedVocabSize=int(args.padded_vocab_size),
            makeVocabSizeDivisibleBy=int(get("make_vocab_size_divisible_by", 128)),
            normalization=get("normalization", "LayerNorm"), normEpsilon=float(get("norm_epsilon", 1e-5)),
            swiglu=bool(get("swiglu", False)), positionEmbeddingType=get("position_embedding_type", "learned_absolute"),
            rotaryBase=float(get("rotary_base", 10000)), qkLayernorm=bool(get("qk_layernorm", False)),
            addQkvBias=bool(get("add_qkv_bias", False)), addBiasLinear=bool(get("add_bias_linear", True)),
            untieEmbeddingsAndOutputWeights=bool(get("untie_embeddings_and_output_weights", False)),
            scoreHead=bool(get("score_head", False)),
            **moe_fields_from_args(args),
        )
    except AttributeError as e:
        raise CheckpointFileError(f"{source}: checkpoint args lack {e.name or e}") from None
    except (TypeError, ValueError) as e:
        raise CheckpointFileError(f"{source}: checkpoint args describe no valid model: {e}") from None


def checkpoint_args(model: ModelConfig, tp: int, pp: int, layer_counts: list[int], dtype: np.dtype,
                    base: argparse.Namespace | None = None, ep: int = 1, vpp: int | None = None) -> argparse.Namespace:
    """The ``args`` of a written checkpoint: the source's (when it had some) with shape and layout updated."""
    args = copy.copy(base) if base is not None else argparse.Namespace()
    uneven = len(set(layer_counts)) > 1
    vars(args).update(
        num_layers=model.numLayers, hidden_size=model.hiddenSize, ffn_hidden_size=model.ffn_hidden_size,
        num_attention_heads=model.numAttentionHeads, group_query_attention=model.groupQueryAttention,
        num_query_groups=model.num_query_groups, kv_channels=model.head_dim,
        max_position_embeddings=model.maxPositionEmbeddings, vocab_size=model.vocabSize,
        padded_vocab_size=model.padded_vocab_size(tp), make_vocab_size_divisible_by=model.makeVocabSizeDivisibleBy,
        normalization=model.normalization, norm_epsilon=model.normEpsilon, swiglu=model.swiglu,
        position_embedding_type=model.positionEmbeddingType, rotary_base=model.rotaryBase,
        qk_layernorm=model.qkLayernorm, add_qkv_bias=model.addQkvBias, add_bias_linear=model.addBiasLinear,
        untie_embeddings_and_output_weights=model.untieEmbeddingsAndOutputWeights, score_head=model.scoreHead,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp,
        num_layers_per_virtual_pipeline_stage=layer_counts[0] if vpp else None,
        num_layer_list=",".join(map(str, layer_counts)) if uneven else None,
        params_dtype=torch_dtype(dtype), bf16=dtype == BFLOAT16, fp16=dtype == FLOAT16,
        transformer_impl="local", use_mcore_models=True,
        **moe_args(model), expert_model_parallel_size=ep,
    )
    return args


def saved_iterations(root: Path) -> list[int | str]:
    """The iterations present under ``root`` (``iter_*`` folders, ``release``), in order."""
    found: list[int | str] = sorted(int(p.name[5:]) for p in root.glob("iter_*") if p.name[5:].isdigit())
    return found + ([RELEASE] if (root / RELEASE).is_dir() else [])


class MegatronReader:
    """One iteration of a Megatron checkpoint directory (the latest unless ``iteration`` is given), every rank
    file opened lazily."""

    def __init__(self, root: str | Path, lora: bool = False, iteration: int | None = None):
        self.root = Path(root)
        if iteration is not None:
            self.iteration = iteration
            if not iteration_dir(self.root, iteration).is_dir():
                saved = saved_iterations(self.root)
                raise CheckpointFileError(f"{iteration_dir(self.root, iteration)}: no such iteration (saved: "
                                          f"{', '.join(map(str, saved)) or 'none'})")
        else:
            try:
                self.iteration = read_latest(self.root)
            except ValueError as e:
                raise CheckpointFileError(str(e)) from None
            if self.iteration is None:
                raise CheckpointFileError(f"{self.root}: no latest_checkpointed_iteration.txt "
                                          "(not a Megatron checkpoint)")
        base = iteration_dir(self.root, self.iteration)
        # mp_rank_00_000 is PP rank 0 or EP rank 0 (Megatron's names); the args inside say which.
        found = [base / n for n in ("mp_rank_00", "mp_rank_00_000", "mp_rank_00_000_000") if (base / n).is_dir()]
        if not found:
            raise CheckpointFileError(f"{base}: no mp_rank_00, mp_rank_00_000 or mp_rank_00_000_000 folder")
        first = self._open(found[0] / MODEL_FILE)
        self.args = first.obj.get("args") if isinstance(first.obj, dict) else None
        if self.args is None:
            raise CheckpointFileError(f"{first.path}: no 'args' in the checkpoint")
        self.tp = int(getattr(self.args, "tensor_model_parallel_size", 1))
        self.pp = int(getattr(self.args, "pipeline_model_parallel_size", 1))
        self.ep = int(getattr(self.args, "expert_model_parallel_size", None) or 1)
        if found[0].name != rank_dir_name(0, 0, self.pp, 0, self.ep):
            raise CheckpointFileError(f"{base}: folder names disagree with pipeline_model_parallel_size={self.pp} "
                                      f"and expert_model_parallel_size={self.ep}")
        # files[stage][ep_rank][tp_rank]
        self.files = [[[first if (t, s, e) == (0, 0, 0) else
                        self._open(checkpoint_file(self.root, self.iteration, t, s, self.pp, e, self.ep))
                        for t in range(self.tp)] for e in range(self.ep)] for s in range(self.pp)]
        self.model = model_config_from_args(self.args, str(first.path))
        self.vpp = int(getattr(self.args, "virtual_pipeline_model_parallel_size", None) or 1)
        # global key -> (stage, expert-parallel rank, model chunk, key inside that rank's files)
        self.index: dict[str, tuple[int, int, str, str]] = {}
        self.layer_counts = []  # per virtual stage: chunk c of PP rank s is virtual stage c x PP + s
        offset = 0
        for v in range(self.pp * self.vpp):
            s, chunk = v % self.pp, self._chunk_key(v // self.pp)
            local_layers = set()
            for e, ranks in enumerate(self.files[s]):
                for k in self._state(ranks[0], chunk):
                    name = _normalize(k)
                    if is_lora_key(name) != lora:
                        continue
                    found = split_layer_key(name)
                    if found:
                        local_layers.add(found[0])
                    if e > 0 and split_expert_key(name) is None:
                        continue  # dense tensors are in every expert-parallel rank's file; read rank 0's
                    name = expert_to_global(name, self.model, self.ep, e)
                    self.index[with_layer(name, found[0] + offset) if found else name] = (s, e, chunk, k)
            self.layer_counts.append(len(local_layers))
            offset += len(local_layers)

    def _chunk_key(self, chunk: int) -> str:
        """``model``, or ``model<c>`` with virtual pipeline stages (Megatron-LM's names)."""
        return "model" if self.vpp == 1 else f"model{chunk}"

    @staticmethod
    def _open(path: Path) -> LazyTorchFile:
        if not path.is_file():
            raise CheckpointFileError(f"{path}: rank file is missing")
        return LazyTorchFile(path)

    @staticmethod
    def _state(f: LazyTorchFile, chunk: str = "model") -> dict:
        obj = f.obj
        if not isinstance(obj, dict) or chunk not in obj:
            raise CheckpointFileError(f"{f.path}: no {chunk!r} state dict (virtual pipeline stages in the file and "
                                      f"virtual_pipeline_model_parallel_size in its args disagree?)")
        return obj[chunk]

    @property
    def iteration_number(self) -> int:
        return 0 if self.iteration == RELEASE else int(self.iteration)

    def keys(self) -> list[str]:
        return list(self.index)

    def load(self, key: str, meta: bool = False) -> np.ndarray:
        """The whole tensor (merged over TP ranks) for a global key."""
        if key not in self.index:
            raise CheckpointFileError(f"{self.root}: checkpoint has no tensor {key}")
        stage, ep_rank, chunk, local = self.index[key]
        lazy = []
        for f in self.files[stage][ep_rank]:
            value = self._state(f, chunk).get(local)
            if not isinstance(value, LazyTensor):
                raise CheckpointFileError(f"{f.path}: {local} is missing or not a tensor")
            lazy.append(value)
        kind = split_kind(key, self.model)
        if meta:
            return merge([t.meta() for t in lazy], kind, key)
        if kind in ("column", "vocab") and len(lazy) > 1 and all(t.contiguous for t in lazy):
            return self._read_stacked(lazy)
        return merge([t.load() for t in lazy], kind, key)

    @staticmethod
    def _read_stacked(shards: list[LazyTensor]) -> np.ndarray:
        """Dim-0 shards read straight into their rows of the whole tensor: no second copy of a big embedding."""
        rows = sum(t.shape[0] for t in shards)
        out = np.empty((rows, *shards[0].shape[1:]), dtype=shards[0].dtype)
        start = 0
        for t in shards:
            t.read_into(out[start:start + t.shape[0]])
            start += t.shape[0]
        return out

