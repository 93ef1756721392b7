"""A Megatron checkpoint as an inference model on this rank: shape and layout from its ``args``, weights from
this rank's ``mp_rank_*`` file. Shared by ``generate`` and ``evaluate``."""
from __future__ import annotations

import torch

from ..checkpoint.layout import checkpoint_file, read_latest


def _mapped(path):
    """``torch.load`` of a rank file, memory-mapped: reading its ``args`` touches none of the tensors' bytes (a
    7B stage is gigabytes, and ``args`` is read before loading), and loading copies each tensor once, into the
    model. A legacy (pre-zip) file cannot be mapped and is read whole."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except RuntimeError:
        return torch.load(path, map_location="cpu", weights_only=False)


def read_args(root: str):
    """(latest iteration, the checkpoint's ``args`` namespace) from the first rank's file."""
    from ..checkpoint.training import CheckpointMismatch

    iteration = read_latest(root)
    if iteration is None:
        raise CheckpointMismatch(f"{root}: no latest_checkpointed_iteration.txt (not a Megatron checkpoint)")
    for pp in (1, 2):  # the first rank's folder: mp_rank_00 (PP = 1) or mp_rank_00_000
        path = checkpoint_file(root, iteration, 0, 0, pp)
        if path.is_file():
            args = _mapped(path)["args"]
            if getattr(args, "lora_r", None):
                raise CheckpointMismatch(f"{root}: a LoRA adapter checkpoint; merge it into its base first "
                                         "(`ascend-engine convert --lora-load ...`)")
            return iteration, args
    raise CheckpointMismatch(f"{root}: iteration {iteration} has no mp_rank_00 or mp_rank_00_000 folder")


def not_loadable(args) -> str | None:
    """Why inference cannot load this checkpoint's files as they are (each expert-parallel rank's file holds only
    its own experts; virtual pipeline stages split a rank's layers into chunks), or None."""
    ep = int(getattr(args, "expert_model_parallel_size", None) or 1)
    vpp = getattr(args, "num_layers_per_virtual_pipeline_stage", None)
    if ep > 1:
        return f"expert parallel size {ep}"
    return f"virtual pipeline stages of {vpp} layers" if vpp else None


def layout(args) -> tuple[int, int]:
    """(TP, PP) of a checkpoint inference can load as it is; others are refused with the reshard that fixes them."""
    from ..checkpoint.training import CheckpointMismatch

    if why := not_loadable(args):
        raise CheckpointMismatch(f"checkpoint saved with {why}: reshard it for inference first (`ascend-engine "
                                 "convert --load-model-type mg --save-model-type mg --target-expert-parallel-size 1`, "
                                 "no --num-layers-per-virtual-pipeline-stage)")
    return int(args.tensor_model_parallel_size), int(args.pipeline_model_parallel_size)


def load_model(root: str, iteration, args, tp_rank: int, pp_rank: int, device):
    """(ModelConfig, this rank's GPTModel stage in eval mode with the checkpoint's weights, max sequence length).
    Megatron's parallel state must already be set up at the checkpoint's TP/PP. The stage is built without
    Megatron's random initialisation (a large share of the loading time, overwritten right after), so every
    parameter must come from the file: one it lacks is an error, not a random weight."""
    from ..config.train import ParallelConfig
    from ..convert.megatron_io import model_config_from_args
    from ..models.gpt import build_gpt_model

    model = model_config_from_args(args, root)
    tp, pp = layout(args)
    max_len = int(getattr(args, "max_position_embeddings", None) or args.seq_length)
    gpt = build_gpt_model(model, ParallelConfig(tensorModelParallelSize=tp, pipelineModelParallelSize=pp), max_len,
                          initialize=False)
    gpt.to(device)
    path = checkpoint_file(root, iteration, tp_rank, pp_rank, pp)
    state = _mapped(path)
    missing = [k for k in gpt.load_state_dict(state["model"], strict=False).missing_keys
               if not k.endswith("_extra_state")]
    if missing:
        from ..checkpoint.training import CheckpointMismatch

        raise CheckpointMismatch(f"{path}: lacks {len(missing)} of the model's weights ({', '.join(missing[:3])}"
                                 f"{', ...' if len(missing) > 3 else ''}): not a checkpoint of this model")
    gpt.eval()
    return model, gpt, max_len
