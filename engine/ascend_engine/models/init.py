"""Weight initialisation that does not depend on the parallel layout.

Megatron draws each rank's weights from a generator whose position depends on what that rank built before
(its pipeline stage, its tensor-parallel shapes), so the same seed gives different models at TP=1 and TP=2 or
PP=2. Here every parameter is drawn whole, from a generator seeded by (seed, global parameter name), and each
rank keeps its tensor-parallel slice. The same seed then gives the same model under any TP/PP/DP layout, which
makes layouts comparable and runs reproducible when the cluster shape changes.

Distributions follow Megatron's defaults: normal(0, std) for weights, std / sqrt(2 x layers) for the output
projections of attention and MLP (``linear_proj``, ``linear_fc2``), ones for norms, zeros for biases.
"""
from __future__ import annotations

import math
import re
import zlib

import torch

from ..config.train import ModelConfig

_LOCAL_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
_LOCAL_EXPERT = re.compile(r"\.mlp\.experts\.local_experts\.(\d+)\.")


def _expert_offset(gpt) -> int:
    """Global number of this rank's first routed expert (experts are split over expert-parallel ranks)."""
    config = getattr(gpt, "config", None)
    experts = getattr(config, "num_moe_experts", None)
    if not experts:
        return 0
    from megatron.core import parallel_state

    return parallel_state.get_expert_model_parallel_rank() * (experts // config.expert_model_parallel_size)


def global_names(gpt) -> dict[str, str]:
    """Local parameter name -> name in the whole (unsplit, one-stage) model: layer and expert numbers become
    global."""
    out = {}
    layers = gpt.decoder.layers if hasattr(gpt, "decoder") else []
    expert_offset = _expert_offset(gpt)
    for name, _ in gpt.named_parameters():
        m = _LOCAL_LAYER.match(name)
        if m:
            global_index = layers[int(m[1])].layer_number - 1
            name_global = f"decoder.layers.{global_index}." + name[m.end():]
        else:
            name_global = name
        name_global = _LOCAL_EXPERT.sub(lambda e: f".mlp.experts.local_experts.{int(e[1]) + expert_offset}.",
                                        name_global)
        out[name] = name_global
    return out


def _full_shape(param: torch.Tensor, tp: int) -> tuple[int, ...]:
    shape = list(param.shape)
    if getattr(param, "tensor_model_parallel", False) and tp > 1:
        shape[param.partition_dim] *= tp
    return tuple(shape)


def _tp_slice(full: torch.Tensor, param: torch.Tensor, name: str, model: ModelConfig, tp: int,
              tp_rank: int) -> torch.Tensor:
    if not getattr(param, "tensor_model_parallel", False) or tp == 1:
        return full
    dim = param.partition_dim
    if name.endswith("linear_fc1.weight") and model.swiglu:  # dense, expert and shared-expert MLPs
        # [gate; up] whole -> [gate_i; up_i] per rank, as Megatron's fused SwiGLU expects.
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp, dim=0)[tp_rank], up.chunk(tp, dim=0)[tp_rank]], dim=0)
    # QKV rows are grouped per query group, so a plain chunk hands each rank whole groups.
    return full.chunk(tp, dim=dim)[tp_rank]


def _draw(name: str, shape: tuple[int, ...], model: ModelConfig, seed: int) -> torch.Tensor:
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "bias":
        return torch.zeros(shape)
    if "norm" in name.rsplit(".", 2)[-2]:
        return torch.ones(shape)
    std = model.initMethodStd
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):  # also the experts' fc2
        std = std / math.sqrt(2.0 * model.numLayers)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.empty(shape).normal_(0.0, std, generator=gen)


@torch.no_grad()
def init_layout_independent(gpt, model: ModelConfig, seed: int, tp: int, tp_rank: int) -> None:
    """Overwrite every parameter of this rank's GPTModel stage with its slice of the seeded whole tensor."""
    names = global_names(gpt)
    for local_name, param in gpt.named_parameters():
        name = names[local_name]
        if name == "output_layer.weight" and not model.untieEmbeddingsAndOutputWeights:
            name = "embedding.word_embeddings.weight"  # the last stage's copy of a tied embedding
        full = _draw(name, _full_shape(param, tp), model, seed)
        param.copy_(_tp_slice(full, param, name, model, tp, tp_rank).to(param.dtype))
