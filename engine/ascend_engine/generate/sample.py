"""Token-by-token continuation through Megatron's forward-only schedule, at any TP/PP layout."""
from __future__ import annotations

import torch

from .config import GenerateConfig


def pick_token(logits: torch.Tensor, top_p: float | None, temperature: float, generator: torch.Generator) -> int:
    """Greedy (``top_p`` None), or a sample from the smallest set of tokens whose probability reaches top_p."""
    if top_p is None:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    sorted_probs, order = probs.sort(descending=True)
    keep = sorted_probs.cumsum(0) - sorted_probs < top_p  # always keeps the most likely token
    kept = sorted_probs * keep
    choice = torch.multinomial(kept / kept.sum(), 1, generator=generator)
    return int(order[choice])


def generate(cfg: GenerateConfig) -> str | None:
    """The prompt and its continuation on global rank 0 (None elsewhere). Collective over the torchrun world."""
    from ..device import select_backend

    backend = select_backend(cfg.device)
    backend.apply()
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region
    from transformers import AutoTokenizer

    from ..parallel import destroy_parallel, init_parallel
    from .loading import layout, load_model, read_args

    iteration, args = read_args(cfg.load)
    tp, pp = layout(args)
    info = init_parallel(backend, tp, pp, cfg.seed)
    try:
        tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizerNameOrPath)
        model, gpt, max_len = load_model(cfg.load, iteration, args, info.tp_rank, info.pp_rank,
                                         backend.torch_device)
        tokens = tokenizer(cfg.prompt, add_special_tokens=False)["input_ids"] if cfg.prompt else []
        if not tokens:
            tokens = [tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id]
        prompt_len = len(tokens)
        generator = torch.Generator().manual_seed(cfg.seed)
        device = backend.torch_device

        def forward_step(data_iterator, module):
            ids = next(data_iterator)
            positions = torch.arange(ids.shape[1], device=device).unsqueeze(0)
            logits = module(ids, positions, None)
            return logits, lambda out: (out.new_zeros(()), {"logits": out.detach()})

        for _ in range(min(cfg.maxNewTokens, max_len - prompt_len)):
            ids = torch.tensor([tokens], device=device)
            with torch.no_grad():
                out = get_forward_backward_func()(
                    forward_step_func=forward_step, data_iterator=iter([ids]), model=[gpt], num_microbatches=1,
                    seq_length=ids.shape[1], micro_batch_size=1, forward_only=True)
            chosen = torch.tensor([-1], dtype=torch.long, device=device)
            if info.is_last_stage:
                logits = gather_from_tensor_model_parallel_region(out[0]["logits"])[0, -1, :model.vocabSize]
                chosen[0] = pick_token(logits, cfg.topP, cfg.temperature, generator)
            if torch.distributed.is_initialized():
                torch.distributed.all_reduce(chosen, op=torch.distributed.ReduceOp.MAX)
            tokens.append(int(chosen[0]))
            if tokens[-1] == tokenizer.eos_token_id:
                break
        if info.rank == 0:
            return tokenizer.decode(tokens)
        return None
    finally:
        destroy_parallel()
