"""Generation at a single pipeline stage: the model called directly, each row at positions of its own.

Every distinct prompt is encoded once at its own length (prompts of one length together) into a preallocated
``RaggedKVCache``, rows repeating a prompt (GRPO's samples) copy its keys and values, and each decode step is
one forward of one token per unfinished row, each at its row's next position, under a [rows, keys] mask made
once per step. There is no pipeline schedule, no padding and no walk through the longer prompts' tails; a
finished row leaves the batch, and with more prompts than cache slots the next prompt is encoded into the freed
slot right away (continuous batching: the batch stays full while prompts wait, instead of running down to its
longest row). Tokens and log-probabilities are those of ``batched``'s layered loop (the
reference), which pipelines and the uncached path still take.
"""
from __future__ import annotations

import torch

from .. import device as devices
from ..models.cached_rotary import CachedRotarySelfAttention
from ..models.inference_linears import direct_linears, packed_products
from . import lean_forward
from .tokens import Generated, pick_tokens


def direct_path_fits(gpt) -> bool:
    """One pipeline stage whose attention layers all read a ``RaggedKVCache`` (rotary or learned positions)."""
    from megatron.core import parallel_state
    from megatron.core.transformer.attention import Attention

    if parallel_state.get_pipeline_model_parallel_world_size() != 1:
        return False
    if getattr(gpt, "position_embedding_type", None) == "mrope":
        return False
    attentions = [m for m in gpt.modules() if isinstance(m, Attention)]
    return bool(attentions) and all(isinstance(m, CachedRotarySelfAttention) for m in attentions)


def _forward(gpt, ids: torch.Tensor, positions: torch.Tensor, mask, cache, vocab_size: int) -> torch.Tensor:
    """[b, s] tokens -> logits [b, V] (fp32) after their last token; every TP rank holds the gathered row."""
    logits = gpt(ids, positions, mask, inference_context=cache, runtime_gather_output=True)
    return logits[:, -1, :vocab_size].float()


def _prefill(gpt, prompts: list[list[int]], cache, vocab_size: int, device, step, first: int = 0) -> torch.Tensor:
    """Encode every distinct prompt once into cache slots ``first``.. (those of one length in one forward,
    ``step``'s if given), copy its cache to the slots of the prompts that repeat it; the logits [b, V] after each
    prompt."""
    first_seen: dict[tuple, int] = {}
    source = [first_seen.setdefault(tuple(p), i) for i, p in enumerate(prompts)]
    by_length: dict[int, list[int]] = {}
    for i in first_seen.values():
        by_length.setdefault(len(prompts[i]), []).append(i)
    logits = None
    for length, rows in by_length.items():
        index = torch.tensor(rows, device=device)
        mask = cache.prefill(index + first, length)
        ids = torch.tensor([prompts[i] for i in rows], device=device)
        if step is not None:
            got = step(ids, cache.positions, mask, cache)[:, :vocab_size].float()
        else:
            got = _forward(gpt, ids, cache.positions, None, cache, vocab_size)
        if logits is None:
            logits = got.new_empty(len(prompts), got.shape[1])
        logits[index] = got
    repeats = [i for i, s in enumerate(source) if s != i]
    if repeats:
        targets = torch.tensor(repeats, device=device)
        sources = torch.tensor([source[i] for i in repeats], device=device)
        cache.copy_rows(sources + first, targets + first, max(len(p) for p in prompts))
        logits[targets] = logits[sources]
    return logits


def _replayed(graphs, step, cache, picked: torch.Tensor, position: torch.Tensor, device) -> torch.Tensor:
    """The decode step's logits [n, padded vocabulary] from a captured graph (``device.step_graphs``).

    A graph's shapes are fixed, so it attends over the whole cache (the keys no row has reached masked), and it
    runs a power-of-two number of slots (at most the cache's): the rows that finished leave the batch as
    before, and the slots past the last active one run a dummy token at position 0 whose result nobody reads
    (those slots' cache rows are dead after ``keep_rows``). A generation captures a few graphs (16 rows: 16, 8,
    4, 2, 1), not one per count of active rows."""
    n = len(picked)
    slots = min(1 << (n - 1).bit_length(), cache.max_batch_size)
    tokens = torch.cat([picked, picked.new_zeros(slots - n)]).to(device)
    positions = torch.cat([position, position.new_zeros(slots - n)]).to(device)
    mask = cache.decode(positions, cache.max_sequence_length)
    return graphs(lambda *inputs: step(*inputs, cache), tokens, positions, mask)[:n]


def generate_direct(gpt, prompts: list[list[int]], *, slots: int, **kwargs):
    """``generate_batch`` at one pipeline stage with a cache (its arguments checked there). The loop runs in
    ``inference_mode``; what it returns is copied out of it, so training may use the tokens and log-probs."""

    lean = lean_forward.fits(gpt)
    with torch.inference_mode(), direct_linears(gpt, packed_products(gpt, slots)) as products:
        tokens, log_probs, response_len = _decode(gpt, prompts, slots=slots, products=products if lean else None,
                                                  **kwargs)
    return Generated(tokens=tokens.clone(), log_probs=log_probs.clone(), prompt_lengths=[len(p) for p in prompts],
                     response_lengths=response_len.tolist())


def _decode(gpt, prompts: list[list[int]], *, slots: int, max_new_tokens: int, eos_id: int | None,
            vocab_size: int, total: int, sampling, uniform: torch.Tensor | None, pad_id: int, finished, done, device,
            products: dict | None):
    from ..models.ragged_cache import RaggedKVCache

    b = len(prompts)
    lengths = torch.tensor([len(p) for p in prompts])
    tokens = torch.full((b, total), pad_id, dtype=torch.long)
    for i, p in enumerate(prompts):
        tokens[i, :len(p)] = torch.tensor(p)
    log_probs = torch.zeros(b, total)
    response_len = torch.zeros(b, dtype=torch.long)
    last_allowed = torch.clamp(lengths + max_new_tokens, max=total) - 1
    cache = RaggedKVCache(slots, total)
    step = lean_forward.LeanForward(gpt, total, products) if products is not None else None
    logits = _prefill(gpt, prompts[:slots], cache, vocab_size, device, step)
    graphs = devices.step_graphs(device) if step is not None else None  # CUDA's captured decode steps
    active = torch.arange(slots)  # original row of each cache slot
    waiting = slots  # the next row to enter a free slot
    position = lengths[:slots].clone()  # the position each active row fills next
    while True:
        picked = pick_tokens(logits, sampling, None if uniform is None else uniform[active, position])
        # log-softmax at the picked token only: no [rows, vocabulary] result written per step
        picked_lp = logits.gather(-1, picked.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
        picked, picked_lp = picked.cpu(), picked_lp.cpu()
        tokens[active, position] = picked
        log_probs[active, position] = picked_lp
        response_len[active] += 1
        stop = position >= last_allowed[active]
        if eos_id is not None:
            stop |= picked == eos_id
        if finished is not None:
            stop |= torch.tensor([finished(int(r), tokens[r, lengths[r]:p + 1].tolist())
                                  for r, p in zip(active.tolist(), position.tolist())], dtype=torch.bool)
        if done is not None:
            for row in active[stop].tolist():
                done(row)
        entering = list(range(waiting, min(b, waiting + int(stop.sum()))))  # rows that take the freed slots
        waiting += len(entering)
        if bool(stop.all()) and not entering:
            break
        if bool(stop.any()):
            keep = (~stop).nonzero().squeeze(1)
            if len(keep):
                cache.keep_rows(keep.to(device), int(position.max()))
            active, position, picked = active[keep], position[keep], picked[keep]
        parts = []
        if len(active) and graphs is not None:
            parts.append(_replayed(graphs, step, cache, picked, position, device)[:, :vocab_size].float())
        elif len(active):
            position_dev = position.to(device)
            mask = cache.decode(position_dev, int(position.max()) + 1)  # the length from the host copy: no sync
            if step is not None:
                parts.append(step(picked.to(device), position_dev, mask, cache)[:, :vocab_size].float())
            else:
                parts.append(_forward(gpt, picked.unsqueeze(1).to(device), position_dev.unsqueeze(1), mask, cache,
                                      vocab_size))
        position = position + 1
        if entering:  # continuous batching: the next prompts are encoded into the slots after the active rows
            parts.append(_prefill(gpt, [prompts[i] for i in entering], cache, vocab_size, device, step,
                                  first=len(active)))
            active = torch.cat([active, torch.tensor(entering)])
            position = torch.cat([position, lengths[entering]])
        logits = torch.cat(parts) if len(parts) > 1 else parts[0]
    end = int((lengths + response_len).max())
    return tokens[:, :end], log_probs[:, :end], response_len
