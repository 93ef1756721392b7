"""Validation loss during training, as Megatron-LM computes and logs it.

Every ``evalInterval`` steps (and after the last) the model runs forward only over ``evalIters`` global batches
of the validation part of ``data.split``: the same first samples each time, laid out over data-parallel ranks
and micro-batches exactly as training batches are, so successive figures compare like with like. The loss is
the mean of the micro-batches' token-mean losses over all of them and all data-parallel replicas (Megatron's
``evaluate``). Logged as ``validation loss at iteration N | lm loss value: ... | lm loss PPL: ...``, written to
TensorBoard (``lm loss validation``, ``lm loss validation ppl``) and the metrics endpoint (``validationLoss``).
"""
from __future__ import annotations

import math

import torch

from ..config.train import TrainConfig
from .batches import micro_batches


def validation_enabled(cfg: TrainConfig) -> bool:
    return cfg.training.evalInterval is not None and cfg.training.evalIters > 0


def build_validation_data(cfg: TrainConfig):
    from ..data.build import build_train_data

    return build_train_data(cfg, part=1)


def is_due(cfg: TrainConfig, iteration: int) -> bool:
    t = cfg.training
    return validation_enabled(cfg) and (iteration % t.evalInterval == 0 or iteration == t.trainIters)


def validation_loss(trainer) -> float:
    """Forward-only over ``evalIters`` global batches of validation data; collective on all ranks."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    t, info = trainer.cfg.training, trainer.info
    losses: list[dict] = []
    for chunk in trainer.chunks:
        chunk.eval()
    with torch.no_grad():
        for step in range(t.evalIters):
            data = [trainer.stage.prepare(micro_batches(
                trainer.valid.sample, trainer.valid.batch, step * t.globalBatchSize, t.microBatchSize, info.dp,
                info.dp_rank, trainer.num_micro, trainer.vocab_size)) for _ in trainer.chunks]
            losses += get_forward_backward_func()(
                forward_step_func=trainer._forward_step, data_iterator=data if len(data) > 1 else data[0],
                model=trainer.chunks,
                num_microbatches=trainer.num_micro, seq_length=t.seqLength,
                micro_batch_size=t.microBatchSize * trainer.stage.rows_per_sample, forward_only=True)
    for chunk in trainer.chunks:
        chunk.train()
    return trainer._average_metrics(losses)["lm loss"]


def format_validation(iteration: int, loss: float) -> str:
    ppl = math.exp(min(20.0, loss))
    line = f" validation loss at iteration {iteration} | lm loss value: {loss:.6E} | lm loss PPL: {ppl:.6E} | "
    bar = "-" * (len(line) + 1)
    return f"{bar}\n{line}\n{bar}"


def run_validation(trainer) -> float:
    """Compute, log and publish the validation loss at the trainer's current iteration."""
    loss = validation_loss(trainer)
    if trainer.info.rank == 0:
        print(format_validation(trainer.iteration, loss), flush=True)
        if trainer.tensorboard:
            trainer.tensorboard.add_scalar("lm loss validation", loss, trainer.iteration)
            trainer.tensorboard.add_scalar("lm loss validation ppl", math.exp(min(20.0, loss)), trainer.iteration)
            trainer.tensorboard.flush()
        if trainer.metrics:
            trainer.metrics.set(validationLoss=loss)
        if getattr(trainer, "trackers", None):
            trainer.trackers.log({"validationLoss": loss}, trainer.iteration)
    return loss
