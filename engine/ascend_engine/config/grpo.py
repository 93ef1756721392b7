"""``GrpoConfig``: the rollout, reward and policy-update settings of ``train.stage: grpo`` (MindSpeed-RL's names).

One GRPO iteration takes ``training.globalBatchSize`` prompts (MindSpeed-RL's ``global_batch_size``), samples
``nSamplesPerPrompt`` responses to each with the policy itself, scores them with rule rewards and/or a frozen
outcome reward model (MindSpeed-RL's "reward" role), and makes
``policyUpdates`` optimizer steps on the whole rollout batch.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, PositiveInt, model_validator

from .base import EngineModel, Flag

BUILTIN_VERIFIERS = ("math", "exact_match", "format")


class GrpoConfig(EngineModel):
    """GRPO settings (used only when stage is grpo)."""

    nSamplesPerPrompt: Annotated[PositiveInt, Flag("--n-samples-per-prompt")] = 8
    """Responses sampled per prompt (the group whose rewards are normalised together)."""
    maxNewTokens: Annotated[PositiveInt, Flag("--max-new-tokens")] = 256
    """Longest response; prompt plus response must fit in training.seqLength."""
    maxNumSeqs: Annotated[PositiveInt | None, Flag("--max-num-seqs")] = None
    """Responses a rank decodes at once during the rollout (vLLM's and MindSpeed-RL's max_num_seqs; default: all
    of its rows): bounds the rollout's KV-cache memory. A response that ends hands its cache slot to the next one
    waiting (continuous batching at one pipeline stage; with PP > 1 the rows run in batches of this size); the
    sampled tokens do not depend on it."""
    temperature: Annotated[float, Field(gt=0), Flag("--temperature")] = 1.0
    """Sampling temperature of the rollouts."""
    topP: Annotated[float, Field(gt=0, le=1), Flag("--top-p")] = 1.0
    """Nucleus sampling: sample from the smallest set of tokens reaching this probability."""
    klCoef: Annotated[float, Field(ge=0), Flag("--kl-coef")] = 0.0
    """Weight of the k3 KL penalty against the frozen reference (the starting model; preference.refModel when
    resuming). 0 builds no reference."""
    clipRatio: Annotated[float, Field(gt=0, lt=1), Flag("--clip-ratio")] = 0.2
    """PPO clip range: the probability ratio to the rollout policy is clipped to [1 - c, 1 + c]."""
    policyUpdates: Annotated[PositiveInt, Flag("--policy-updates")] = 1
    """Optimizer steps on each rollout batch (MindSpeed-RL's epochs over it); past the first, the clip applies."""
    lossAggregation: Annotated[Literal["token_mean", "sequence_mean"], Flag("--loss-agg-mode")] = "token_mean"
    """token_mean: every response token of a micro-batch weighs the same; sequence_mean: per response first."""
    verifierFunction: Annotated[list[str], Flag("--verifier-function")] = ["math"]
    """Rule rewards: math, exact_match, format, or a user function as package.module:function(response,
    reference) -> float. The first one decides accuracy (reward > 0). May be empty with rewardModel."""
    verifierWeight: Annotated[list[float], Flag("--verifier-weight")] = []
    """Weight of each verifier function (default 1 each); the reward is the weighted sum."""
    rewardModel: Annotated[str | None, Flag("--reward-model")] = None
    """An ORM checkpoint (train.stage orm: the policy's model shape with a score head, saved at this run's TP/PP
    layout), loaded frozen; its score at each response's last token joins the rule rewards before the group
    normalisation."""
    rewardModelWeight: Annotated[float, Flag("--reward-model-weight")] = 1.0
    """Weight of the reward model's score in the reward (the rule rewards keep verifierWeight)."""
    logEntropy: Annotated[bool, Flag("--no-log-entropy", invert=True)] = True
    """Report the policy's mean token entropy over the responses (costs a pass over the logits)."""

    @model_validator(mode="after")
    def _verifiers(self) -> "GrpoConfig":
        if not self.verifierFunction and self.rewardModel is None:
            raise ValueError("verifierFunction is empty and there is no rewardModel: nothing would score a response")
        for name in self.verifierFunction:
            if name not in BUILTIN_VERIFIERS and ":" not in name:
                raise ValueError(f"verifierFunction: {name!r} is neither a built-in reward "
                                 f"({', '.join(BUILTIN_VERIFIERS)}) nor package.module:function")
        if self.verifierWeight and len(self.verifierWeight) != len(self.verifierFunction):
            raise ValueError(f"verifierWeight has {len(self.verifierWeight)} weights for "
                             f"{len(self.verifierFunction)} verifierFunction entries")
        return self

    @property
    def rewards(self) -> dict[str, float]:
        weights = self.verifierWeight or [1.0] * len(self.verifierFunction)
        return dict(zip(self.verifierFunction, weights))


def check_grpo_run(cfg) -> None:
    """What a ``stage: grpo`` TrainConfig needs beyond its own section."""
    g = cfg.grpo
    if not cfg.data.tokenizerNameOrPath:
        raise ValueError("data.tokenizerNameOrPath (--tokenizer-name-or-path) is required for stage grpo: "
                         "the rewards read decoded text")
    if cfg.data.mockData:
        raise ValueError("stage grpo reads R1 prompt data (data.dataPath), not mockData")
    if g.maxNewTokens >= cfg.training.seqLength:
        raise ValueError(f"grpo.maxNewTokens ({g.maxNewTokens}) leaves no room for a prompt in "
                         f"training.seqLength ({cfg.training.seqLength})")
    if cfg.data.neatPack or cfg.data.variableSeqLengths:
        raise ValueError("stage grpo lays out its rollouts itself: unset data.neatPack and data.variableSeqLengths")
