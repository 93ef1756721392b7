"""``PreferenceConfig``: the objective of the pairwise stages (``train.stage`` dpo / simpo), MindSpeed-LLM's flags.

DPO compares the policy with a frozen reference model; SimPO needs none (it length-normalises the log-probability
of each reply and asks for a margin instead).
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .base import EngineModel, Flag

Stage = Literal["pretrain", "sft", "dpo", "simpo", "orm", "prm", "grpo"]
PAIRWISE_STAGES = ("dpo", "simpo", "orm")
"""Stages that read preference pairs (orm: an outcome reward model ranks chosen above rejected)."""


class PreferenceConfig(EngineModel):
    """DPO and SimPO settings (used only when stage is dpo or simpo), and PRM's reward tokens (stage prm)."""

    dpoBeta: Annotated[float, Field(gt=0), Flag("--dpo-beta")] = 0.1
    """DPO temperature beta: rewards are beta x (policy - reference) log-probabilities."""
    dpoLossType: Annotated[Literal["sigmoid", "hinge", "ipo"], Flag("--dpo-loss-type")] = "sigmoid"
    """DPO loss: sigmoid (the paper's), hinge (SLiC) or ipo (squared, on length-normalised log-probabilities)."""
    dpoLabelSmoothing: Annotated[float, Field(ge=0, lt=0.5), Flag("--dpo-label-smoothing")] = 0.0
    """Conservative DPO: the assumed probability that a pair's labels are flipped (sigmoid loss)."""
    refModel: Annotated[str | None, Flag("--ref-model")] = None
    """Megatron checkpoint of the frozen DPO reference, at this run's TP/PP layout; default checkpoint.load (the
    starting model). Required to resume a DPO run, whose checkpoint.load is then the trained policy."""
    simpoBeta: Annotated[float, Field(gt=0), Flag("--simpo-beta")] = 2.5
    """SimPO reward scale beta (rewards are beta x mean log-probability of the reply)."""
    gammaBetaRatio: Annotated[float, Field(ge=0), Flag("--gamma-beta-ratio")] = 1.4
    """SimPO target margin gamma, as the ratio gamma / beta."""
    simpoLossType: Annotated[Literal["sigmoid", "hinge"], Flag("--simpo-loss-type")] = "sigmoid"
    """SimPO loss: sigmoid or hinge."""
    simpoLabelSmoothing: Annotated[float, Field(ge=0, lt=0.5), Flag("--simpo-label-smoothing")] = 0.0
    """SimPO label smoothing (sigmoid loss)."""
    rewardTokens: Annotated[list[str], Flag("--reward-tokens")] = []
    """Stage prm: the tokens a step's label may be (e.g. + and -), each one token of data.tokenizerNameOrPath;
    their logits at a step's placeholder are the process reward model's classifier."""


def check_prm_run(cfg) -> None:
    """Stage prm reads process reward data and classifies each step by the reward tokens' logits."""
    if not cfg.preference.rewardTokens:
        raise ValueError("stage prm needs preference.rewardTokens (--reward-tokens), e.g. + and -")
    if len(set(cfg.preference.rewardTokens)) != len(cfg.preference.rewardTokens):
        raise ValueError(f"preference.rewardTokens: {cfg.preference.rewardTokens} names a token twice")
    if not cfg.data.tokenizerNameOrPath:
        raise ValueError("stage prm needs data.tokenizerNameOrPath (--tokenizer-name-or-path) to find the ids of "
                         "preference.rewardTokens")
    if cfg.data.neatPack:
        raise ValueError("stage prm reads one process reward sample per row; data.neatPack does not apply")
