"""``ascend-engine generate``: load a checkpoint at its TP/PP layout and continue one prompt (``batched``)."""
from __future__ import annotations

import torch

from ..checkpoint.layout import checkpoint_file, read_latest
from .config import GenerateConfig


def _read_args(root: str):
    from ..checkpoint.training import CheckpointMismatch

    iteration = read_latest(root)
    if iteration is None:
        raise CheckpointMismatch(f"{root}: no latest_checkpointed_iteration.txt (not a Megatron checkpoint)")
    for pp in (1, 2):  # the first rank's folder: mp_rank_00 (PP = 1) or mp_rank_00_000
        path = checkpoint_file(root, iteration, 0, 0, pp)
        if path.is_file():
            return iteration, torch.load(path, map_location="cpu", weights_only=False)["args"]
    raise CheckpointMismatch(f"{root}: iteration {iteration} has no mp_rank_00 or mp_rank_00_000 folder")


def generate(cfg: GenerateConfig) -> str | None:
    """The prompt and its continuation on global rank 0 (None elsewhere). Collective over the torchrun world."""
    from ..device import select_backend

    backend = select_backend(cfg.device)
    backend.apply()
    from transformers import AutoTokenizer

    from ..checkpoint.training import CheckpointMismatch
    from ..config.train import ParallelConfig
    from ..convert.megatron_io import model_config_from_args
    from ..models.gpt import build_gpt_model
    from ..parallel import destroy_parallel, init_parallel
    from .batched import Sampling, generate_batch

    iteration, args = _read_args(cfg.load)
    model = model_config_from_args(args, cfg.load)
    tp, pp = int(args.tensor_model_parallel_size), int(args.pipeline_model_parallel_size)
    if getattr(args, "lora_r", None):
        raise CheckpointMismatch(f"{cfg.load}: a LoRA adapter checkpoint; merge it into its base first "
                                 "(`ascend-engine convert --lora-load ...`)")
    info = init_parallel(backend, tp, pp, cfg.seed)
    try:
        tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizerNameOrPath)
        max_len = int(getattr(args, "max_position_embeddings", None) or args.seq_length)
        gpt = build_gpt_model(model, ParallelConfig(tensorModelParallelSize=tp, pipelineModelParallelSize=pp),
                              max_len)
        gpt.to(backend.torch_device)
        state = torch.load(checkpoint_file(cfg.load, iteration, info.tp_rank, info.pp_rank, pp), map_location="cpu",
                           weights_only=False)
        gpt.load_state_dict(state["model"], strict=False)
        gpt.eval()
        tokens = tokenizer(cfg.prompt, add_special_tokens=False)["input_ids"] if cfg.prompt else []
        if not tokens:
            tokens = [tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id]
        generated = generate_batch(
            gpt, [tokens], max_new_tokens=cfg.maxNewTokens, eos_id=tokenizer.eos_token_id,
            vocab_size=model.vocabSize, max_length=max_len, sampling=Sampling(cfg.topP, cfg.temperature),
            generator=torch.Generator().manual_seed(cfg.seed), use_cache=cfg.kvCache)
        tokens = tokens + generated.responses()[0]
        if info.rank == 0:
            return tokenizer.decode(tokens)
        return None
    finally:
        destroy_parallel()
