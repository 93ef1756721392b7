"""GRPO's rollout: this data-parallel rank's prompts, each sampled ``nSamplesPerPrompt`` times by the policy itself.

Generation runs on the training model at the training layout (co-located, as MindSpeed-RL's integrated worker):
``generate_batch`` with Megatron's static KV cache, the model in eval mode and without gradients; every rank of
a model-parallel group ends with the same tokens. The sampler's generator is seeded from (seed, iteration,
data-parallel rank), so a resumed run samples exactly what the uninterrupted one did, and TP/PP layouts sample
alike. The rows are then laid out as training rows of ``seqLength`` tokens (prompt, response, zeros), with
next-token labels and a loss mask over the response tokens. With a reward model (``score_rows``), its score of
each row, times ``rewardModelWeight``, is added to the rule rewards before the group normalisation.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...config.grpo import GrpoConfig
from ...data.sources import DataError
from ...rl.grpo import group_advantages
from ...rl.rewards import load_reward_function, score


@dataclass
class Rollout:
    """One step's rollout rows on this rank (prompt-major: the group of prompt i is rows i*n .. i*n+n-1)."""

    tokens: torch.Tensor  # [R, S] prompt, response, then 0
    labels: torch.Tensor  # [R, S] tokens shifted left (labels[t] is the token at t + 1)
    loss_mask: torch.Tensor  # [R, S] True where the label is a response token
    old_logps: torch.Tensor  # [R, S] log p of each label at rollout time (0 outside the mask)
    advantages: torch.Tensor  # [R]
    rewards: torch.Tensor  # [R]
    correct: torch.Tensor  # [R] the first verifier scored > 0 (without verifiers: the reward model did)
    model_scores: torch.Tensor | None  # [R] the reward model's scores (None without one)
    response_lengths: torch.Tensor  # [R] generated tokens (an EOS included)
    row_lengths: torch.Tensor  # [R] prompt plus response tokens
    seconds: float


def rollout_generator(seed: int, iteration: int, dp_rank: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + iteration * 7919 + dp_rank) % 2**63)


def roll_out(gpt, prompts: list[list[int]], references: list[str], cfg: GrpoConfig, tokenizer, *,
             seq_length: int, vocab_size: int, generator: torch.Generator,
             score_rows: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> Rollout:
    """Sample, score and lay out the responses to ``prompts`` (collective over the model-parallel group).

    ``score_rows(tokens, loss_mask)``: the reward model's scores [R] of the laid-out rows (collective too)."""
    from ...generate.batched import generate_batch
    from ...generate.tokens import Sampling

    start = time.perf_counter()
    n = cfg.nSamplesPerPrompt
    longest = max(len(p) for p in prompts)
    if longest >= seq_length:
        raise DataError(f"data.dataPath: a prompt of {longest} tokens leaves no room for a response in "
                        f"training.seqLength ({seq_length})")
    rows = [p for p in prompts for _ in range(n)]
    sampling = Sampling(top_p=cfg.topP, temperature=cfg.temperature)
    gen = generate_batch(gpt, rows, max_new_tokens=cfg.maxNewTokens, eos_id=tokenizer.eos_token_id,
                         vocab_size=vocab_size, max_length=seq_length, sampling=sampling, generator=generator,
                         slots=cfg.maxNumSeqs)
    texts = tokenizer.batch_decode(gen.responses(), skip_special_tokens=True)
    refs = [r for r in references for _ in range(n)]
    rewards = torch.tensor(score(texts, refs, cfg.rewards), dtype=torch.float32)

    r, length = len(rows), gen.tokens.shape[1]
    tokens = torch.zeros(r, seq_length, dtype=torch.long)
    tokens[:, :length] = gen.tokens
    labels = torch.zeros_like(tokens)
    labels[:, :-1] = tokens[:, 1:]
    loss_mask = torch.zeros(r, seq_length, dtype=torch.bool)
    loss_mask[:, :length - 1] = gen.response_mask()[:, 1:]
    old_logps = torch.zeros(r, seq_length)
    old_logps[:, :length - 1] = gen.log_probs[:, 1:]
    model_scores = score_rows(tokens, loss_mask) if score_rows is not None else None
    if model_scores is not None:
        rewards = rewards + cfg.rewardModelWeight * model_scores
    if cfg.verifierFunction:
        first = load_reward_function(cfg.verifierFunction[0])
        correct = torch.tensor([float(first(t, r)) > 0 for t, r in zip(texts, refs)])
    else:
        correct = model_scores > 0
    return Rollout(tokens=tokens, labels=labels, loss_mask=loss_mask, old_logps=old_logps,
                   advantages=group_advantages(rewards, n), rewards=rewards, correct=correct,
                   model_scores=model_scores,
                   response_lengths=torch.tensor(gen.response_lengths, dtype=torch.float64),
                   row_lengths=torch.tensor(gen.response_lengths, dtype=torch.float64)
                   + torch.tensor(gen.prompt_lengths, dtype=torch.float64),
                   seconds=time.perf_counter() - start)
