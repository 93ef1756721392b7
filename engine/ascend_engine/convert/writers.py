"""Write an unsplit model (sources.Unsplit) as a Megatron checkpoint or as HF safetensors, layer by layer.

Both writers run twice: first with ``meta=True`` (shapes only, nothing written) so every mapping, split and
shape error surfaces before the first byte; then for real into a temporary folder the command renames.
Memory: one tensor and its TP shards at a time; files are streamed (torch_file, safetensors_io).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..checkpoint.layout import checkpoint_file
from ..config.model import ModelConfig
from ..telemetry import Progress
from .arrays import Rows, is_meta, meta as meta_array, nbytes, stack_rows
from .families import Family, to_hf
from .mcore_layout import (EMBEDDING, OUTPUT, expert_to_local, is_extra_state, model_keys, split_kind,
                           split_layer_key, stage_keys)
from .megatron_io import CHECKPOINT_VERSION, checkpoint_args
from .safetensors_io import SafetensorsWriter
from .sources import Unsplit
from .tensor_parallel import split
from .torch_file import StreamingTorchWriter


@dataclass
class Totals:
    tensors: int = 0
    bytes: int = 0
    hf_plan: list = field(default_factory=list)  # (name, dtype, shape) in write order, from the meta pass


def fit_vocab(tensor: np.ndarray, rows: int) -> np.ndarray | Rows:
    """Trim padding rows, or pad by repeating the last row (as Megatron-LM's converters do: a padded logit then
    equals a real one and never wins a greedy argmax on its own)."""
    if tensor.shape[0] >= rows:
        return tensor[:rows]
    return stack_rows([tensor, np.broadcast_to(tensor[-1:], (rows - tensor.shape[0], *tensor.shape[1:]))])


def _prepare(unsplit: Unsplit, key: str, rows: int, dtype: np.dtype | None, meta: bool) -> np.ndarray | Rows:
    tensor = unsplit.get(key, meta)
    if key in (EMBEDDING, OUTPUT):
        tensor = fit_vocab(tensor, rows)
    if dtype is None or tensor.dtype == dtype:
        return tensor
    return meta_array(tensor.shape, dtype) if is_meta(tensor) else tensor.astype(dtype)


def _local(key: str, offset: int) -> str:
    found = split_layer_key(key)
    return f"decoder.layers.{found[0] - offset}.{found[1]}" if found else key


def write_megatron(unsplit: Unsplit, target: ModelConfig, root: Path, iteration, tp: int, layer_counts: list[int],
                   dtype: np.dtype | None, base_args: argparse.Namespace | None, meta: bool,
                   progress: Progress | None = None, ep: int = 1, vpp: int | None = None) -> Totals:
    """``root/iter_*/mp_rank_*/model_optim_rng.pt`` for every (TP, PP, EP) rank; returns counts.

    ``layer_counts`` has one entry per pipeline stage, or with ``vpp`` per virtual stage: PP rank p then holds
    chunks ``model0``, ``model1``, ... where chunk c is virtual stage c x PP + p (Megatron's interleaving).
    Expert parallelism: each EP rank's file holds every dense tensor and its own routed experts, numbered from 0
    (Megatron's SequentialMLP ``local_experts``); an expert tensor is read once and goes to one rank's files."""
    chunks = vpp or 1
    stages, totals = len(layer_counts), Totals()
    pp = stages // chunks
    starts = [sum(layer_counts[:v]) for v in range(stages)]
    padded = target.padded_vocab_size(tp)
    first_dtype = dtype if dtype is not None else unsplit.get(EMBEDDING, meta=True).dtype
    args = checkpoint_args(target, tp, pp, layer_counts, first_dtype, base_args, ep, vpp)
    iteration_number = 0 if iteration == "release" else int(iteration)
    ranks = [(t, e) for e in range(ep) for t in range(tp)]
    for stage in range(pp):
        writers = {} if meta else {(t, e): StreamingTorchWriter(_rank_file(root, iteration, t, stage, pp, e, ep))
                                   for t, e in ranks}
        models: list[dict[tuple[int, int], dict]] = [{r: {} for r in ranks} for _ in range(chunks)]
        for chunk, states in enumerate(models):
            virtual = chunk * pp + stage
            offset, count = starts[virtual], layer_counts[virtual]
            layer = None
            for key in stage_keys(target, offset, count, virtual == 0, virtual == stages - 1):
                local = _local(key, offset)
                found = split_layer_key(key)
                if progress and found and layer is not None and found[0] != layer:
                    progress.update(1, f"layer {layer}")
                layer = found[0] if found else layer
                owners = {e: expert_to_local(local, target, ep, e) for e in range(ep)}
                owners = {e: name for e, name in owners.items() if name is not None}
                if is_extra_state(key):
                    for (t, e), state in states.items():
                        if e in owners:
                            state[owners[e]] = None
                    continue
                tensor = _prepare(unsplit, key, padded, dtype, meta)
                for t, shard in enumerate(split(tensor, split_kind(key, target), tp, key)):
                    for e, name in owners.items():
                        states[(t, e)][name] = shard if meta else writers[(t, e)].add(shard)
                        totals.tensors += 1
                        totals.bytes += nbytes(shard)
            if progress and layer is not None and count:
                progress.update(1, f"layer {layer}")
        for rank, writer in writers.items():
            entries = {"model": models[0][rank]} if vpp is None else {f"model{c}": m[rank] for c, m in enumerate(models)}
            writer.close({**entries, "args": args, "checkpoint_version": CHECKPOINT_VERSION,
                          "iteration": iteration_number})
    return totals


def _rank_file(root: Path, iteration, tp_rank: int, pp_rank: int, pp: int, ep_rank: int, ep: int) -> Path:
    path = checkpoint_file(root, iteration, tp_rank, pp_rank, pp, ep_rank, ep)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def write_hf(unsplit: Unsplit, target: ModelConfig, family: Family, directory: Path, dtype: np.dtype | None,
             max_shard_bytes: int, meta: bool, plan: list | None = None, progress: Progress | None = None) -> Totals:
    """Safetensors shards and their index; ``plan`` is the meta pass's ``Totals.hf_plan``."""
    totals = Totals()
    rows = family.rows_for(target)
    writer = None if meta else SafetensorsWriter(directory, plan, max_shard_bytes)
    layer = None
    for key in model_keys(target):
        if is_extra_state(key) or (key == OUTPUT and not target.untieEmbeddingsAndOutputWeights):
            continue
        found = split_layer_key(key)
        if progress and found and layer is not None and found[0] != layer:
            progress.update(1, f"layer {layer}")
        layer = found[0] if found else layer
        rule, _, names = rows[key]
        tensor = _prepare(unsplit, key, target.vocabSize, dtype, meta)
        for name, part in zip(names, to_hf(rule, tensor, target)):
            if meta:
                totals.hf_plan.append((name, part.dtype, tuple(part.shape)))
            else:
                writer.add(name, part)
            totals.tensors += 1
            totals.bytes += nbytes(part)
    if progress and layer is not None:
        progress.update(1, f"layer {layer}")
    if writer:
        writer.close()
    return totals
