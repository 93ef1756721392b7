"""The reward model's scalar score head (``model.scoreHead``, stage orm).

A reward model is the language model with its output layer (hidden -> vocabulary) replaced by one linear map
hidden -> 1, as HF's ``*ForSequenceClassification`` with ``num_labels=1``. The head is the model's ``score``
parameter (key ``score.weight``, HF's name), whole on every tensor-parallel rank: the final hidden states it reads
are whole there too (sequence parallelism is refused for this stage), so every rank computes the same scores and
gradients and nothing needs reducing. GPTModel still calls ``output_layer`` after the final norm; that slot gets a
parameterless shim that runs ``score``, so the model returns [b, s, 1] scores where it returned logits.
"""
from __future__ import annotations

import torch


class ScoreThroughOutputLayer(torch.nn.Module):
    """Sits in GPTModel's ``output_layer`` slot and runs the model's ``score`` head (not a submodule here, so the
    state dict names it once, as ``score.weight``)."""

    sequence_parallel = False

    def __init__(self, score: torch.nn.Linear):
        super().__init__()
        self.__dict__["score"] = score  # bypasses module registration on purpose

    def forward(self, hidden_states, weight=None, runtime_gather_output=None):
        return self.score(hidden_states), None


def attach_score_head(gpt) -> None:
    """Replace the last pipeline stage's output layer of ``gpt`` with the score head (initialised afterwards,
    like every weight, by ``init_layout_independent`` or a checkpoint)."""
    config = gpt.config
    gpt.score = torch.nn.Linear(config.hidden_size, 1, bias=False, dtype=config.params_dtype)
    gpt.output_layer = ScoreThroughOutputLayer(gpt.score)


def last_token_index(loss_mask: torch.Tensor) -> torch.Tensor:
    """Index [b] of each row's last real token: the one after the last position whose next token is trained on
    (the reply's final token, EOS), at most the last position. HF's sequence classifiers read the same token."""
    positions = torch.arange(loss_mask.shape[1], device=loss_mask.device)
    last_target = torch.where(loss_mask.bool(), positions, -1).max(dim=1).values
    return (last_target + 1).clamp(max=loss_mask.shape[1] - 1)


def from_language_model(gpt, saved: dict) -> dict:
    """``saved`` (one rank's state dict) as ``gpt`` loads it: a reward model started from a language model's
    checkpoint (SFT or converted) drops the LM output layer and keeps its freshly initialised score head, as
    HF's ``from_pretrained`` of a ``*ForSequenceClassification`` does. Anything else is returned unchanged."""
    score = getattr(gpt, "score", None)
    if not isinstance(score, torch.nn.Linear) or "score.weight" in saved:
        return saved
    kept = {k: v for k, v in saved.items() if not k.startswith("output_layer.")}
    return kept | {"score.weight": score.weight.detach().clone()}
