"""What generation returns and how the next token is picked: shared by the layered loop (``batched``) and the
direct path (``ragged``)."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    """Greedy when ``top_p`` is None; otherwise nucleus sampling at ``temperature``."""

    top_p: float | None = None
    temperature: float = 1.0


@dataclass
class Generated:
    """The outcome for a batch, identical on every rank of a model-parallel group.

    ``tokens`` [b, T]: prompt then response, padded with ``pad_id`` after each row's end;
    ``log_probs`` [b, T]: log p(token | tokens before it) under the model's own (untempered) distribution at the
    response positions, 0 at prompt and padding positions; ``prompt_lengths`` and ``response_lengths`` per row
    (a response includes its end-of-sequence token).
    """

    tokens: torch.Tensor
    log_probs: torch.Tensor
    prompt_lengths: list[int]
    response_lengths: list[int]

    def response_mask(self) -> torch.Tensor:
        """[b, T] True at the response positions."""
        pos = torch.arange(self.tokens.shape[1]).unsqueeze(0)
        start = torch.tensor(self.prompt_lengths).unsqueeze(1)
        end = start + torch.tensor(self.response_lengths).unsqueeze(1)
        return (pos >= start) & (pos < end)

    def responses(self) -> list[list[int]]:
        return [self.tokens[i, p:p + n].tolist()
                for i, (p, n) in enumerate(zip(self.prompt_lengths, self.response_lengths))]


def pick_tokens(logits: torch.Tensor, sampling: Sampling, uniform: torch.Tensor | None) -> torch.Tensor:
    """[b, V] logits -> [b] tokens: argmax, or a sample from the smallest set reaching probability ``top_p``.

    A sample is the token where the kept probabilities' running sum, in vocabulary order, first passes
    ``uniform`` [b] (numbers in [0, 1) drawn per row and position before generation starts): a row's tokens
    depend on its own distribution and numbers only, not on which rows share its forward or when it reaches a
    position, and two nearly equal probabilities that swap places under rounding (another TP layout) do not move
    the boundaries between tokens."""
    if sampling.top_p is None:  # max's index is argmax's (the first of equal maxima); on CPU at 2x its speed
        return logits.max(dim=-1).indices
    probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
    if sampling.top_p >= 1.0:  # every token kept: no sort (GRPO's default; the sort was a tenth of a rollout)
        kept = probs
    else:
        sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
        keep = sorted_probs.cumsum(-1) - sorted_probs < sampling.top_p  # always keeps the most likely token
        kept = probs * torch.zeros_like(keep).scatter(-1, order, keep)
    running = kept.cumsum(-1)
    threshold = uniform.to(running.device).unsqueeze(-1) * running[:, -1:]
    return (running <= threshold).sum(-1).clamp(max=probs.shape[-1] - 1)
