"""Loading the distributed optimizer's state (its part of ``model_optim_rng.pt`` and the shards in
``distrib_optim.pt``, Megatron-LM's legacy torch format).

megatron-core 0.16 gets three things wrong here when the inner optimizer is torch's own Adam, which it uses
wherever neither TransformerEngine nor Apex is installed (CPU, and GPUs/NPUs without the fused Adam):

- ``load_state_dict`` gives every parameter's state the same ``step`` tensor; torch's Adam increments each
  parameter's step in place, so after one step the shared counter has run ahead by the number of parameters and
  Adam's bias correction is wrong from the first resumed step on. Each parameter gets its own copy here.
- ``load_parameter_state_from_dp_zero`` copies into each parameter's fp32 main shard in place without disabling
  autograd; in fp32 training that shard is a view of the model's leaf parameter, and torch refuses ("a view of a
  leaf Variable that requires grad is being used in an in-place operation"). Its other loaders carry
  ``@torch.no_grad``; we call it under one.
- the same loader copies every key of the parameter's optimizer state from the file, which holds only ``param``,
  ``exp_avg`` and ``exp_avg_sq``; torch's ``step`` is a KeyError. The step, already restored from the param
  groups, is set aside during the copy and put back.

The file formats are untouched, so checkpoints still move to and from Megatron-LM.
"""
from __future__ import annotations

import torch

_NOT_IN_FILE = ("step",)


def _inner_optimizers(optimizer) -> list:
    """The torch optimizers inside a (chained) Megatron optimizer."""
    chained = getattr(optimizer, "chained_optimizers", [optimizer])
    return [o.optimizer for o in chained if hasattr(o, "optimizer")]


def load_distributed_optimizer(optimizer, state_dict: dict, shards_path: str) -> None:
    """Collective over the data-parallel group: restore the optimizer from its ``state_dict`` (the file's
    ``optimizer`` entry) and the shards that data-parallel rank 0 reads from ``shards_path`` and scatters."""
    optimizer.load_state_dict(state_dict)
    held = []
    for inner in _inner_optimizers(optimizer):
        for state in inner.state.values():
            if isinstance(state.get("step"), torch.Tensor):
                state["step"] = state["step"].clone()
            held.append((state, {k: state.pop(k) for k in _NOT_IN_FILE if k in state}))
    try:
        with torch.no_grad():
            optimizer.load_parameter_state(shards_path)
    finally:
        for state, kept in held:
            state.update(kept)
