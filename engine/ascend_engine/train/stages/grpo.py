"""grpo: reinforcement learning from verifiable rewards on the shared loop (MindSpeed-RL's GRPO, co-located).

Each step, before the pipeline schedule runs, ``prepare`` turns this rank's prompt micro-batches into response
rows: the policy samples ``nSamplesPerPrompt`` responses per prompt (``rollout.py``), rule rewards score the
decoded text and a frozen ORM (``grpo.rewardModel``, ``reward_model.py``) the rows, advantages are normalised per
group, and the frozen reference (``klCoef`` > 0; the DPO stage's
reference code: a copy of the starting weights, or with LoRA the policy with its adapters off) adds its
log-probabilities. The loop then runs ``policyUpdates`` forward/backward passes and optimizer steps on those rows
with ``grpo_loss``. With one update the old log-probabilities are the current ones, detached (the ratio is 1
and the gradient is REINFORCE with the group baseline); with more, they are the rollout's, so the clip applies.
"""
from __future__ import annotations

import time
from functools import partial

import torch

from ...config.train import TrainConfig
from ...device import all_reduce_host
from ...models.wrappers import unwrap
from ...rl.grpo import aggregate, grpo_loss
from .base import Batch, Stage, real_vocab_cross_entropy
from .preference import PreferenceStage


class GrpoStage(Stage):
    metric_keys = ("lm loss", "grpo/policy_loss", "grpo/kl", "grpo/clip_fraction", "grpo/entropy")

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.grpo = cfg.grpo
        self.rows_per_sample = cfg.grpo.nSamplesPerPrompt
        self.updates_per_step = cfg.grpo.policyUpdates
        self.reference = None
        self.reward_model = None
        self.tokenizer = None
        self._rollout_stats: dict[str, float] = {}
        self._rolled_out_at = 0.0

    def setup(self, trainer) -> None:
        from transformers import AutoTokenizer

        super().setup(trainer)
        path = trainer.cfg.data.tokenizerNameOrPath
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if self.tokenizer.eos_token_id is None:
            raise ValueError(f"data.tokenizerNameOrPath: {path} has no EOS token to end a response")
        if self.grpo.klCoef and not self.cfg.lora.enabled:
            self.reference = PreferenceStage._build_reference(self)
        if self.grpo.rewardModel is not None:
            from .reward_model import RewardModel

            self.reward_model = RewardModel(trainer, self.grpo.rewardModel)

    # ------------------------------------------------------------ rollout, rewards, reference

    def prepare(self, batches: list[Batch]) -> list[Batch]:
        from .rollout import roll_out, rollout_generator

        trainer, t = self.trainer, self.cfg.training
        prompts = [p for b in batches for p in b["prompts"]]
        references = self.tokenizer.batch_decode([r for b in batches for r in b["references"]],
                                                 skip_special_tokens=True)
        rows = t.microBatchSize * self.rows_per_sample
        score_rows = (partial(self.reward_model.score, rows_per_micro_batch=rows)
                      if self.reward_model is not None else None)
        trainer.model.eval()
        try:
            rollout = roll_out(unwrap(trainer.model), prompts, references, self.grpo, self.tokenizer,
                               seq_length=t.seqLength, vocab_size=self.cfg.model.vocabSize,
                               generator=rollout_generator(t.seed, trainer.iteration, trainer.info.dp_rank),
                               score_rows=score_rows)
        finally:
            trainer.model.train()
        self._rollout_stats = self._reduce_rollout_stats(rollout)
        self._rolled_out_at = time.perf_counter()
        out = []
        for k in range(len(batches)):
            part = slice(k * rows, (k + 1) * rows)
            batch = {"tokens": rollout.tokens[part], "labels": rollout.labels[part],
                     "loss_mask": rollout.loss_mask[part], "advantages": rollout.advantages[part]}
            if self.updates_per_step > 1:
                batch["old_logps"] = rollout.old_logps[part]
            out.append(batch)
        if self.grpo.klCoef:
            self._attach_reference_logps(out)
        return out

    def _attach_reference_logps(self, batches: list[Batch]) -> None:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        t = self.cfg.training

        def reference_step(data_iterator, model):
            batch = next(data_iterator)
            return self._logits(model, batch), partial(self._logps_only, batch)

        with torch.no_grad(), PreferenceStage._reference_mode(self) as model:
            results = get_forward_backward_func()(
                forward_step_func=reference_step, data_iterator=iter(batches), model=[model],
                num_microbatches=len(batches), seq_length=t.seqLength,
                micro_batch_size=t.microBatchSize * self.rows_per_sample, forward_only=True)
        for batch, result in zip(batches, results or []):
            batch["ref_logps"] = result["logps"]

    def _reduce_rollout_stats(self, rollout) -> dict[str, float]:
        """Reward, accuracy and length figures over all data-parallel ranks (every rank gets them)."""
        from megatron.core import parallel_state

        rewards = rollout.rewards.double()
        sums = torch.stack([torch.tensor(float(rewards.numel()), dtype=torch.float64), rewards.sum(),
                            (rewards ** 2).sum(), rollout.correct.double().sum(), rollout.response_lengths.sum(),
                            rollout.row_lengths.sum(),
                            rollout.model_scores.double().sum() if rollout.model_scores is not None
                            else torch.zeros((), dtype=torch.float64)])
        seconds = torch.tensor([rollout.seconds], dtype=torch.float64)
        if torch.distributed.is_initialized():
            group = parallel_state.get_data_parallel_group()
            sums = all_reduce_host(sums, group=group)
            seconds = all_reduce_host(seconds, torch.distributed.ReduceOp.MAX, group=group)
        count, total, squares, correct, response_tokens, row_tokens, model_scores = sums.tolist()
        mean = total / count
        var = max(squares / count - mean * mean, 0.0) * count / max(count - 1, 1)
        self._update_tokens = row_tokens * self.updates_per_step
        return {"grpo/reward_mean": mean, "grpo/reward_std": var ** 0.5, "grpo/accuracy": correct / count,
                "grpo/response_length": response_tokens / count, "timing/rollout_s": float(seconds),
                "tokens_per_s/rollout": response_tokens / max(float(seconds), 1e-9),
                **({"grpo/reward_model_score": model_scores / count} if self.reward_model is not None else {})}

    def step_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        seconds = time.perf_counter() - self._rolled_out_at
        return {**metrics, **self._rollout_stats, "timing/update_s": seconds,
                "tokens_per_s/update": self._update_tokens / max(seconds, 1e-9)}

    # ------------------------------------------------------------ the policy

    def _logits(self, model, batch: Batch) -> torch.Tensor:
        """Vocabulary-parallel logits [b, s, v/tp] on the last pipeline stage, hidden states elsewhere."""
        from ...models.gpt import rope_positions

        device = self.trainer.backend.torch_device
        tokens = batch["tokens"].to(device)
        positions = torch.arange(tokens.shape[1], device=device).unsqueeze(0).expand_as(tokens)
        return model(tokens, rope_positions(unwrap(model), positions), None)

    def _token_logps(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        labels = batch["labels"].to(logits.device)
        return -real_vocab_cross_entropy(logits, labels, self.cfg.model.vocabSize)

    def _logps_only(self, batch: Batch, logits: torch.Tensor):
        return logits.new_zeros(()), {"logps": self._token_logps(logits, batch).detach()}

    def forward_step(self, data_iterator, model):
        batch = next(data_iterator)
        return self._logits(model, batch), partial(self._loss, batch)

    def _loss(self, batch: Batch, logits: torch.Tensor):
        device = logits.device
        logps = self._token_logps(logits, batch)
        mask = batch["loss_mask"].to(device)
        old = batch["old_logps"].to(device) if "old_logps" in batch else logps.detach()
        ref = batch["ref_logps"].to(device) if "ref_logps" in batch else None
        g = self.grpo
        out = grpo_loss(logps, old, batch["advantages"].to(device), mask, clip_ratio=g.clipRatio,
                        kl_coef=g.klCoef, ref_log_probs=ref, aggregation=g.lossAggregation)
        entropy = token_entropy(logits.detach(), self.cfg.model.vocabSize) if g.logEntropy else None
        # clone: the schedule divides the returned loss in place by the number of micro-batches
        return out.loss, {"lm loss": out.loss.detach().clone(), "grpo/policy_loss": out.policy_loss,
                          "grpo/kl": out.kl, "grpo/clip_fraction": out.clip_fraction,
                          "grpo/entropy": aggregate(entropy, mask, "token_mean") if entropy is not None
                          else logps.new_zeros(())}


def token_entropy(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Entropy [b, s] of the softmax over the real vocabulary of vocabulary-parallel logits [b, s, v/tp]."""
    from megatron.core import parallel_state

    group = parallel_state.get_tensor_model_parallel_group()
    part = logits.shape[-1]
    first = parallel_state.get_tensor_model_parallel_rank() * part
    padding = torch.arange(first, first + part, device=logits.device) >= vocab_size
    logits = logits.float().masked_fill(padding, float("-inf"))
    top = logits.max(-1, keepdim=True).values
    if parallel_state.get_tensor_model_parallel_world_size() > 1:
        torch.distributed.all_reduce(top, op=torch.distributed.ReduceOp.MAX, group=group)
    shifted = logits - top
    exp = shifted.exp()
    sums = torch.stack([exp.sum(-1), torch.where(padding, 0.0, exp * shifted).sum(-1)])
    if parallel_state.get_tensor_model_parallel_world_size() > 1:
        torch.distributed.all_reduce(sums, group=group)
    return sums[0].log() - sums[1] / sums[0]
