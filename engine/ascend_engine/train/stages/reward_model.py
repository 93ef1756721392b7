"""GRPO's outcome reward model: a frozen ORM checkpoint scoring the rollout rows (``grpo.rewardModel``).

The model is built at the run's TP/PP layout with the policy's shape and the score head of stage orm
(``models/score_head.py``), loaded like the DPO reference (``load_model_weights``, refusing a checkpoint without a
score head) and kept in eval mode without gradients. It reads the rollout rows exactly as the ORM stage reads a
reply: the score at the row's last real token (``sequence_rewards`` over the rows' loss mask), one forward-only
pass of micro-batches through the pipeline schedule. Scores exist on the last pipeline stage and are broadcast
over the pipeline group, so every rank of a replica normalises the same rewards.
"""
from __future__ import annotations

from functools import partial

import torch

from .base import model_inputs
from .reward import sequence_rewards


class RewardModel:
    def __init__(self, trainer, path: str):
        from megatron.core.transformer.module import Float16Module

        from ...checkpoint.training import load_model_weights, rng_state, set_rng_state
        from ...models.gpt import build_gpt_model

        cfg = trainer.cfg
        self.trainer = trainer
        before = rng_state()  # building draws initial weights; the run's random stream must not notice
        gpt = build_gpt_model(cfg.model.model_copy(update={"scoreHead": True}), cfg.parallel,
                              cfg.training.seqLength, trainer.dtype)
        set_rng_state(before)
        gpt.to(trainer.backend.torch_device)
        load_model_weights(gpt, path, trainer, score_head=True)
        for p in gpt.parameters():
            p.requires_grad_(False)
        model = Float16Module(gpt.config, gpt) if trainer.dtype != torch.float32 else gpt
        self.model = model.eval()

    def score(self, tokens: torch.Tensor, loss_mask: torch.Tensor, rows_per_micro_batch: int) -> torch.Tensor:
        """Scores [R] (float32, CPU) of rows ``tokens`` [R, S] whose loss mask marks the response's targets."""
        from megatron.core import parallel_state
        from megatron.core.pipeline_parallel import get_forward_backward_func

        trainer = self.trainer
        batches = [{"tokens": tokens[i:i + rows_per_micro_batch], "loss_mask": loss_mask[i:i + rows_per_micro_batch]}
                   for i in range(0, tokens.shape[0], rows_per_micro_batch)]

        def step(data_iterator, model):
            batch = next(data_iterator)
            return model(*model_inputs(trainer, model, batch)), partial(_scores_only, batch["loss_mask"])

        with torch.no_grad():
            results = get_forward_backward_func()(
                forward_step_func=step, data_iterator=iter(batches), model=[self.model],
                num_microbatches=len(batches), seq_length=tokens.shape[1], micro_batch_size=rows_per_micro_batch,
                forward_only=True)
        device = trainer.backend.torch_device
        scores = (torch.cat([r["scores"] for r in results]).float().to(device) if results
                  else torch.zeros(tokens.shape[0], device=device))
        if parallel_state.get_pipeline_model_parallel_world_size() > 1:
            torch.distributed.broadcast(scores, src=parallel_state.get_pipeline_model_parallel_last_rank(),
                                        group=parallel_state.get_pipeline_model_parallel_group())
        return scores.cpu()


def _scores_only(loss_mask: torch.Tensor, scores: torch.Tensor):
    return scores.new_zeros(()), {"scores": sequence_rewards(scores, loss_mask).detach()}
