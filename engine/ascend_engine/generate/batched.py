"""Batched generation for a Megatron-core ``GPTModel`` stage, at any TP/PP layout, with or without a KV cache.

The cache is megatron-core's own: a ``StaticInferenceContext`` handed to the model, whose attention layers keep
each layer's keys and values (``key_value_memory_dict``) and attend to them from ``sequence_len_offset`` on.

Prompts of different lengths are laid out from position 0 (no left padding), as Megatron's static engine does:
the common prefix (the shortest prompt) is encoded in one forward, then one position at a time for every row;
a row whose prompt is longer than the current position takes its next prompt token instead of the sample. Every
token therefore sits at its true position, sees exactly the tokens before it, and the rectangle ``tokens[:, :t]``
is never padded, which is why the uncached path (a full forward of ``tokens[:, :t]`` at every step) gives the
same numbers and is the reference for the cached one.

Work that is not the model's arithmetic is left out: the prefill encodes each distinct prompt once and copies its
keys and values to the rows that repeat it (GRPO's n samples of a prompt), and a finished row leaves the batch
(its cache slot is compacted away), while the sampler still draws for every row, so the tokens of the rows that
go on are those of the full batch.

At a single pipeline stage with a KV cache, generation takes the direct path of ``ragged``: the model is called
without the pipeline schedule, every prompt is encoded at its own length and each row decodes at its own
position (``RaggedKVCache``); the layered loop below serves pipelines and the uncached reference.

Sampling draws its numbers from one ``torch.Generator`` seeded alike on every rank; the last pipeline stage picks the tokens
(all its TP ranks hold the same gathered logits, so they pick the same) and broadcasts them to the earlier stages
of its pipeline group, so data-parallel replicas may generate different prompts.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .tokens import Generated, Sampling, pick_tokens


def strip_padding(ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """Rows of a padded batch (left or right padding, mask 1 at real tokens) as lists of their real tokens."""
    if ids.shape != attention_mask.shape:
        raise ValueError(f"input ids {tuple(ids.shape)} and attention mask {tuple(attention_mask.shape)} differ")
    rows = []
    for i, (row, mask) in enumerate(zip(ids.tolist(), attention_mask.bool().tolist())):
        real = [j for j, keep in enumerate(mask) if keep]
        if not real:
            raise ValueError(f"prompt {i} is empty (attention mask all zero)")
        if real != list(range(real[0], real[-1] + 1)):
            raise ValueError(f"prompt {i}: padding inside the prompt (the mask is neither left nor right padding)")
        rows.append([row[j] for j in real])
    return rows


def _last_logits(gpt, ids: torch.Tensor, start: int, context, vocab_size: int) -> torch.Tensor | None:
    """Logits [b, V] at the last position of ``ids`` (at positions start..), on the last stage; None elsewhere.

    ``runtime_gather_output`` gathers the vocabulary-parallel logits across TP ranks (Megatron requires it with
    an inference context), so every TP rank of the last stage holds the same full row.
    """
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    positions = torch.arange(start, start + ids.shape[1], device=ids.device).unsqueeze(0).expand_as(ids)

    def forward_step(data_iterator, module):
        batch = next(data_iterator)
        out = module(batch, positions, None, inference_context=context, runtime_gather_output=True)
        return out, lambda o: (o.new_zeros(()), {"logits": o[:, -1].detach()})

    out = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iter([ids]), model=[gpt], num_microbatches=1,
        seq_length=ids.shape[1], micro_batch_size=ids.shape[0], forward_only=True)
    if not parallel_state.is_pipeline_last_stage():
        return None
    return out[0]["logits"][:, :vocab_size].float()


def _share_from_last_stage(device: torch.device, *tensors: torch.Tensor) -> None:
    """Copy the last pipeline stage's values into the same (CPU) tensors on the other stages of its pipeline group.

    They travel on ``device``: NCCL and HCCL only move accelerator tensors.
    """
    from megatron.core import parallel_state

    if parallel_state.get_pipeline_model_parallel_world_size() == 1:
        return
    src = parallel_state.get_pipeline_model_parallel_last_rank()
    group = parallel_state.get_pipeline_model_parallel_group()
    for t in tensors:
        moved = t.to(device)
        torch.distributed.broadcast(moved, src=src, group=group)
        t.copy_(moved.cpu())


def _prefill_distinct(gpt, ids: torch.Tensor, context, vocab_size: int, device) -> torch.Tensor | None:
    """Encode ``ids`` [b, s] into the empty cache, each distinct row once (GRPO's samples of one prompt share
    it): the distinct rows run as a smaller batch, then their keys and values are copied to the rows that repeat
    them. The last position's logits [b, V] on the last stage, None elsewhere."""
    distinct, source = {}, []
    for row in ids.tolist():
        source.append(distinct.setdefault(tuple(row), len(distinct)))
    if len(distinct) == ids.shape[0]:
        return _last_logits(gpt, ids.to(device), 0, context, vocab_size)
    firsts = torch.tensor([source.index(k) for k in range(len(distinct))])
    logits = _last_logits(gpt, ids[firsts].to(device), 0, context, vocab_size)
    index = torch.tensor(source, device=device)
    for key, value in context.key_value_memory_dict.values():
        for memory in (key, value):
            memory[:ids.shape[1], :len(source)] = memory[:ids.shape[1], :len(distinct)][:, index]
    return None if logits is None else logits[index.to(logits.device)]


def _keep_cache_rows(context, keep: list[int], length: int) -> None:
    """Compact the cache to the rows ``keep`` (slot indices, ascending) so finished rows stop costing compute."""
    index = torch.tensor(keep)
    for key, value in context.key_value_memory_dict.values():
        for memory in (key, value):
            memory[:length, :len(keep)] = memory[:length, index.to(memory.device)]


@torch.no_grad()
def generate_batch(gpt, prompts: list[list[int]], *, max_new_tokens: int, eos_id: int | None, vocab_size: int,
                   max_length: int, sampling: Sampling = Sampling(), generator: torch.Generator | None = None,
                   use_cache: bool = True, pad_id: int = 0, finished=None, slots: int | None = None,
                   done=None) -> Generated:
    """Continue every prompt by up to ``max_new_tokens`` (stopping at ``eos_id``), never past ``max_length``.

    Collective over the model-parallel group of ``gpt`` (one pipeline stage, in eval mode). ``vocab_size``
    drops Megatron's padded vocabulary entries before picking. ``finished(row, response_tokens)``, if given,
    ends a row early (evaluation's stop strings); it sees the shared tokens, so every rank decides alike.
    ``slots``: at most that many rows generate at once (all by default); a row that ends hands its slot to the
    next prompt waiting (at a single stage with a cache; elsewhere the prompts run in batches of ``slots``).
    ``done(row)`` is called as each row ends. A row's tokens do not depend on ``slots``: its sampling numbers are
    drawn per row and position.
    """
    from .ragged import direct_path_fits, generate_direct

    if gpt.training:
        raise ValueError("generate_batch needs the model in eval mode (gpt.eval()): no dropout, and Megatron "
                         "uses the KV cache only outside training")
    if use_cache and getattr(gpt, "position_embedding_type", None) == "mrope":
        raise ValueError("the KV cache needs a model built without token_positions: Megatron's static cache slices "
                         "rotary embeddings by cache position, which per-token (mrope) positions do not follow")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if slots is not None and slots < 1:
        raise ValueError(f"slots must be at least 1, got {slots}")
    lengths = [len(p) for p in prompts]
    if max(lengths) >= max_length:
        raise ValueError(f"a prompt of {max(lengths)} tokens leaves no room below the model's {max_length}")
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    device = next(gpt.parameters()).device
    b, total = len(prompts), min(max(lengths) + max_new_tokens, max_length)
    slots = min(b, slots or b)
    uniform = None if sampling.top_p is None else torch.rand(b, total, generator=generator)
    if use_cache and direct_path_fits(gpt):
        return generate_direct(gpt, prompts, slots=slots, max_new_tokens=max_new_tokens, eos_id=eos_id,
                               vocab_size=vocab_size, total=total, sampling=sampling, uniform=uniform, pad_id=pad_id,
                               finished=finished, done=done, device=device)
    parts = []
    for start in range(0, b, slots):
        rows = range(start, min(b, start + slots))
        parts.append(_generate_layered(
            gpt, prompts[start:rows.stop], max_new_tokens=max_new_tokens, eos_id=eos_id, vocab_size=vocab_size,
            total=total, sampling=sampling, uniform=None if uniform is None else uniform[start:rows.stop],
            use_cache=use_cache, pad_id=pad_id, device=device,
            finished=None if finished is None else (lambda i, new, start=start: finished(start + i, new))))
        if done is not None:
            for row in rows:
                done(row)
    return parts[0] if len(parts) == 1 else _joined(parts, pad_id)


def _joined(parts: list[Generated], pad_id: int) -> Generated:
    """The batches' outcomes as one, their tokens padded to the longest."""
    width = max(g.tokens.shape[1] for g in parts)
    pad = [(0, width - g.tokens.shape[1]) for g in parts]
    return Generated(tokens=torch.cat([F.pad(g.tokens, p, value=pad_id) for g, p in zip(parts, pad)]),
                     log_probs=torch.cat([F.pad(g.log_probs, p) for g, p in zip(parts, pad)]),
                     prompt_lengths=[n for g in parts for n in g.prompt_lengths],
                     response_lengths=[n for g in parts for n in g.response_lengths])


def _generate_layered(gpt, prompts: list[list[int]], *, max_new_tokens: int, eos_id: int | None, vocab_size: int,
                      total: int, sampling: Sampling, uniform: torch.Tensor | None, use_cache: bool, pad_id: int,
                      device, finished) -> Generated:
    """One batch through the layered loop (any pipeline layout, cached or not): the reference path."""
    from megatron.core.inference.contexts import StaticInferenceContext

    lengths = [len(p) for p in prompts]
    b = len(prompts)
    tokens = torch.full((b, total), pad_id, dtype=torch.long)
    for i, p in enumerate(prompts):
        tokens[i, :len(p)] = torch.tensor(p)
    log_probs = torch.zeros(b, total)
    prompt_len = torch.tensor(lengths)
    last_allowed = torch.clamp(prompt_len + max_new_tokens, max=total) - 1  # last position a row may fill
    done = torch.zeros(b, dtype=torch.bool)
    response_len = torch.zeros(b, dtype=torch.long)
    context = StaticInferenceContext(b, total) if use_cache else None
    fed = 0  # positions already in the cache
    end = min(lengths)
    active = list(range(b))  # rows still generating, in the order of their cache slots
    for t in range(min(lengths), total):  # fill position t
        if context is not None and not fed:
            logits = _prefill_distinct(gpt, tokens[:, :t], context, vocab_size, device)
        elif context is not None:
            context.sequence_len_offset = fed
            context.enable_decode_mode()
            logits = _last_logits(gpt, tokens[active, fed:t].to(device), fed, context, vocab_size)
        else:
            logits = _last_logits(gpt, tokens[active, :t].to(device), 0, None, vocab_size)
        fed = t
        if logits is not None and len(active) < b:  # finished rows draw from a dummy row, as before
            logits = torch.zeros(b, logits.shape[1], device=logits.device).index_copy_(
                0, torch.tensor(active, device=logits.device), logits)
        picked, picked_lp = torch.zeros(b, dtype=torch.long), torch.zeros(b)
        if logits is not None:
            logits = logits.cpu()
            picked = pick_tokens(logits, sampling, None if uniform is None else uniform[:, t])
            picked_lp = torch.log_softmax(logits, dim=-1).gather(-1, picked.unsqueeze(-1)).squeeze(-1)
        _share_from_last_stage(device, picked, picked_lp)
        in_prompt = t < prompt_len
        generating = ~in_prompt & ~done
        tokens[:, t] = torch.where(generating, picked, tokens[:, t])
        log_probs[:, t] = torch.where(generating, picked_lp, 0.0)
        response_len += generating.long()
        stop = t >= last_allowed
        if eos_id is not None:
            stop |= picked == eos_id
        if finished is not None:
            stop |= torch.tensor([bool(g) and finished(i, tokens[i, prompt_len[i]:t + 1].tolist())
                                  for i, g in enumerate(generating.tolist())])
        done |= generating & stop
        end = t + 1
        if bool(done.all()):
            break
        still = [r for r in active if not done[r]]
        if len(still) < len(active):
            if context is not None:
                _keep_cache_rows(context, [active.index(r) for r in still], fed)
            active = still
    return Generated(tokens=tokens[:, :end], log_probs=log_probs[:, :end], prompt_lengths=lengths,
                     response_lengths=response_len.tolist())
