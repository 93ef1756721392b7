"""``ascend-engine generate``: load a checkpoint at its TP/PP layout and continue one prompt (``batched``)."""
from __future__ import annotations

import torch

from .config import GenerateConfig


def generate(cfg: GenerateConfig) -> str | None:
    """The prompt and its continuation on global rank 0 (None elsewhere). Collective over the torchrun world."""
    from ..device import select_backend

    backend = select_backend(cfg.device)
    backend.apply()
    from ..parallel import destroy_parallel, init_parallel
    from ..tokenizer import load_tokenizer
    from .batched import generate_batch
    from .tokens import Sampling
    from .loading import layout, load_model, read_args

    iteration, args = read_args(cfg.load)
    tp, pp = layout(args)
    info = init_parallel(backend, tp, pp, cfg.seed)
    try:
        tokenizer = load_tokenizer(cfg.tokenizerNameOrPath)
        model, gpt, max_len = load_model(cfg.load, iteration, args, info.tp_rank, info.pp_rank,
                                         backend.torch_device)
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
