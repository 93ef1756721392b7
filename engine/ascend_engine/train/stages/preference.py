"""dpo / simpo: preference pairs, chosen and rejected replies in one forward pass.

Each micro-batch holds ``m`` pairs as ``2m`` rows (chosen first). The model's per-token cross-entropy is the
vocab-parallel one Megatron computes under TP, so a reply's log-probability is minus its sum over the reply's
tokens (prompt labels are -100 and masked), on the last pipeline stage, with the vocabulary's padding rows kept
out of the softmax so the probabilities are the HuggingFace model's.

DPO needs the same log-probabilities under a frozen reference. Before each step the reference runs the step's
micro-batches through the same pipeline schedule, forward only, and the results ride along with the batches to
the policy's loss function (only the last stage reads them). The reference is a second model at the same layout
(from ``preference.refModel``, else a copy of the weights the run starts from); with LoRA it is the policy
itself with its adapters switched off, so there is no second copy.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import partial

import torch

from ...config.loader import ConfigError
from ...config.train import TrainConfig
from ...models.wrappers import unwrap
from .base import Batch, Stage, per_token_loss
from .preference_loss import dpo_losses, sequence_logps, simpo_losses


class ReferenceModelError(ConfigError):
    """A DPO run without a usable reference model; the message says what to set (the CLI exits 2)."""


class PreferenceStage(Stage):
    rows_per_sample = 2
    metric_keys = ("lm loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.dpo = cfg.stage == "dpo"
        self.normalise = not self.dpo or cfg.preference.dpoLossType == "ipo"
        self.reference = None

    # ------------------------------------------------------------ the reference model

    def setup(self, trainer) -> None:
        super().setup(trainer)
        if self.dpo and not self.cfg.lora.enabled:
            self.reference = self._build_reference()

    def _build_reference(self):
        from megatron.core.transformer.module import Float16Module

        from ...models.gpt import build_gpt_model

        cfg, trainer = self.cfg, self.trainer
        ref_path = cfg.preference.refModel
        if ref_path is None and trainer.iteration > 0:
            raise ReferenceModelError(
                f"preference.refModel (--ref-model): this {cfg.stage} run resumes at iteration {trainer.iteration} "
                f"from {cfg.checkpoint.load}, which is the trained policy; set refModel to the checkpoint it started from")
        from ...checkpoint.training import rng_state, set_rng_state

        before = rng_state()  # building draws initial weights; the run's random stream must not notice
        gpt = build_gpt_model(cfg.model, cfg.parallel, cfg.training.seqLength, trainer.dtype,
                              variable_seq_lengths=cfg.data.variableSeqLengths)
        set_rng_state(before)
        gpt.to(trainer.backend.torch_device)
        if ref_path is None:
            gpt.load_state_dict(unwrap(trainer.model).state_dict(), strict=True)
        else:
            from ...checkpoint.training import load_model_weights

            load_model_weights(gpt, ref_path, trainer)
        for p in gpt.parameters():
            p.requires_grad_(False)
        model = Float16Module(gpt.config, gpt) if trainer.dtype != torch.float32 else gpt
        return model.eval()

    @contextlib.contextmanager
    def _reference_mode(self):
        """The policy with adapters off and dropout off (LoRA-DPO), or the separate frozen model."""
        if self.reference is not None:
            yield self.reference
            return
        from ...models.lora import adapters_disabled

        model = self.trainer.model
        model.eval()
        try:
            with adapters_disabled(unwrap(model)):
                yield model
        finally:
            model.train()

    def prepare(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        """Attach the reference's sequence log-probabilities (DPO; on the last pipeline stage)."""
        if not self.dpo:
            return batches
        from megatron.core.pipeline_parallel import get_forward_backward_func

        batches = list(batches)  # read twice: by the reference, then by the policy
        t = self.cfg.training

        def reference_step(data_iterator, model):
            batch = next(data_iterator)
            output = per_token_loss(self.trainer, model, batch, real_vocab_only=True)
            return output, partial(self._logps_only, batch["loss_mask"].to(output.device))

        with torch.no_grad(), self._reference_mode() as model:
            results = get_forward_backward_func()(
                forward_step_func=reference_step, data_iterator=iter(batches), model=[model],
                num_microbatches=len(batches), seq_length=t.seqLength,
                micro_batch_size=t.microBatchSize * self.rows_per_sample, forward_only=True)
        for batch, result in zip(batches, results or []):
            batch["ref_logps"] = result["logps"]
        return iter(batches)

    def _logps(self, loss_mask: torch.Tensor, output_tensor: torch.Tensor) -> torch.Tensor:
        logps, lengths = sequence_logps(output_tensor, loss_mask)
        return logps / lengths.clamp(min=1) if self.normalise else logps

    def _logps_only(self, loss_mask, output_tensor):
        return output_tensor.new_zeros(()), {"logps": self._logps(loss_mask, output_tensor).detach()}

    # ------------------------------------------------------------ the policy

    def forward_step(self, data_iterator, model):
        batch = next(data_iterator)
        output = per_token_loss(self.trainer, model, batch, real_vocab_only=True)
        return output, partial(self._loss, batch["loss_mask"].to(output.device), batch.get("ref_logps"))

    def _loss(self, loss_mask: torch.Tensor, ref_logps: torch.Tensor | None, output_tensor: torch.Tensor):
        logps = self._logps(loss_mask, output_tensor)
        chosen, rejected = logps.chunk(2)
        if self.dpo:
            ref_chosen, ref_rejected = ref_logps.to(logps.device).chunk(2)
            losses, chosen_rewards, rejected_rewards = dpo_losses(self.cfg.preference, chosen, rejected,
                                                                  ref_chosen, ref_rejected)
        else:
            losses, chosen_rewards, rejected_rewards = simpo_losses(self.cfg.preference, chosen, rejected)
        loss = losses.mean()
        # clone: the schedule divides the returned loss in place by the number of micro-batches
        return loss, {"lm loss": loss.detach().clone(), "rewards/chosen": chosen_rewards.mean(),
                      "rewards/rejected": rejected_rewards.mean(),
                      "rewards/margins": (chosen_rewards - rejected_rewards).mean(),
                      "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean()}
