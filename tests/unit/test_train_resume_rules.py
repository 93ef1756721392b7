"""Resume rules that need no processes: the LR schedule must match the checkpoint's unless the run says which
one wins (Megatron-LM's flags), the console ETA counts only this process's iterations, and token ids outside
the vocabulary are refused on the host with the sample named."""
from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest
import torch

from ascend_engine.checkpoint.training import CheckpointMismatch, _restore_scheduler
from ascend_engine.config.loader import ConfigError
from ascend_engine.config.train import TrainConfig
from ascend_engine.data.sources import DataError
from ascend_engine.telemetry import Progress
from ascend_engine.train import command
from ascend_engine.train.batches import micro_batches
from ascend_engine.train.logline import StepStats, format_line
from ascend_engine.train.optim import build_scheduler


def _config(train_iters: int, **optimizer) -> TrainConfig:
    return TrainConfig.model_validate({
        "training": {"trainIters": train_iters},
        "optimizer": {"lr": 1e-3, "minLr": 1e-5, "lrDecayStyle": "cosine", "lrWarmupIters": 2, **optimizer}})


def _scheduler(cfg: TrainConfig, steps: int = 0):
    sched = build_scheduler(cfg, torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0))
    if steps:
        sched.step(increment=steps)
    return sched


def _resume(cfg: TrainConfig, saved: dict):
    trainer = SimpleNamespace(cfg=cfg, scheduler=_scheduler(cfg), info=SimpleNamespace(rank=0))
    _restore_scheduler(trainer, saved, "ckpt/iter_0000005/mp_rank_00/model_optim_rng.pt")
    return trainer.scheduler


def test_resume_with_other_train_iters_is_refused_naming_both_values():
    saved = _scheduler(_config(10), steps=5).state_dict()
    with pytest.raises(CheckpointMismatch) as err:
        _resume(_config(20), saved)
    message = str(err.value)
    assert "ckpt/iter_0000005/mp_rank_00/model_optim_rng.pt" in message
    assert "training.trainIters (--train-iters): this run 20, checkpoint 10" in message
    assert "--override-opt-param-scheduler" in message and "--use-checkpoint-opt-param-scheduler" in message

    with pytest.raises(CheckpointMismatch, match=r"optimizer.lr \(--lr\): this run 0.002, checkpoint 0.001"):
        _resume(_config(10, lr=2e-3), saved)
    # The same schedule resumes without a word, at the checkpoint's step.
    same = _resume(_config(10), saved)
    assert same.num_steps == 5 and same.get_lr(same.optimizer.param_groups[0]) == pytest.approx(
        _scheduler(_config(10), steps=5).get_lr(same.optimizer.param_groups[0]))


def test_override_continues_on_this_runs_schedule_and_use_checkpoint_keeps_the_old_one(capsys):
    saved = _scheduler(_config(10), steps=9).state_dict()
    group = {"lr": 0.0}

    overridden = _resume(_config(20, overrideOptParamScheduler=True), saved)
    assert overridden.lr_decay_steps == 20 and overridden.num_steps == 9
    fresh_20 = _scheduler(_config(20), steps=9)
    assert overridden.get_lr(group) == fresh_20.get_lr(group)
    assert overridden.get_lr(group) > 10 * 1e-5, "learning rate stuck near the old floor"
    assert "using this run's values" in capsys.readouterr().out

    kept = _resume(_config(20, useCheckpointOptParamScheduler=True), saved)
    assert kept.lr_decay_steps == 10
    assert kept.get_lr(group) == _scheduler(_config(10), steps=9).get_lr(group)


def test_the_schedule_is_set_to_the_checkpoints_step_whether_the_scheduler_is_fresh_or_has_run():
    """A resume loads into a fresh scheduler (0 steps); a numerics rollback into the running one, whose 11 steps
    megatron-core's load_state_dict would add the checkpoint's 8 to (cosine at its floor for the rest of the run)."""
    cfg = _config(20)
    saved = _scheduler(cfg, steps=8).state_dict()
    fresh = _resume(cfg, saved)
    trainer = SimpleNamespace(cfg=cfg, scheduler=_scheduler(cfg, steps=11), info=SimpleNamespace(rank=0))
    _restore_scheduler(trainer, saved, "ckpt/iter_0000008/mp_rank_00/model_optim_rng.pt")
    group = {}
    for restored in (fresh, trainer.scheduler):
        assert restored.num_steps == 8
        assert restored.state_dict() == saved
        assert restored.get_lr(group) == _scheduler(cfg, steps=8).get_lr(group) > 1e-4
        # the optimizer's rates are the restored step's, before the next step() moves them
        assert restored.optimizer.param_groups[0]["lr"] == restored.get_lr(group)


def test_schedule_flags_parse_and_exclude_each_other(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")

    def load(*argv):
        parser = argparse.ArgumentParser()
        command.add_arguments(parser)
        return command.load_config(parser.parse_args(list(argv)))

    assert load("--override-opt-param-scheduler").optimizer.overrideOptParamScheduler
    assert load("--use-checkpoint-opt-param-scheduler").optimizer.useCheckpointOptParamScheduler
    with pytest.raises(ConfigError, match="overrideOptParamScheduler and useCheckpointOptParamScheduler"):
        load("--override-opt-param-scheduler", "--use-checkpoint-opt-param-scheduler")


def test_eta_after_resume_counts_only_this_process(monkeypatch):
    clock = [1000.0]  # the test's clock: on a loaded machine real time passes between the lines below
    monkeypatch.setattr("ascend_engine.telemetry.time.monotonic", lambda: clock[0])
    progress = Progress("train", total=10_000, unit="iters", enabled=False, already_done=5000)
    assert progress.eta() is None  # nothing done here yet: no rate to go by
    clock[0] += 10.0  # ten seconds in ...
    progress.update(5)  # ... five iterations done by this process
    assert progress.rate() == pytest.approx(0.5, rel=0.01)
    assert progress.eta() == pytest.approx(4995 / 0.5, rel=0.01)
    assert progress.line().startswith("[train] 5005/10000 iters (50.0%), 0.5 iters/s, ETA 2:46:")


def test_log_line_shows_eta():
    stats = StepStats(iteration=6, train_iters=10, consumed_samples=24, ms_per_iter=250.0, learning_rate=1e-3,
                      global_batch_size=4, loss=2.5, grad_norm=1.0, tokens_per_second=512.0,
                      tflops_per_device=0.001, mfu=0.01, eta_seconds=3725.0)
    line = format_line(stats)
    assert "| elapsed time per iteration (ms): 250.0 | ETA: 1:02:05 |" in line
    assert "ETA" not in format_line(StepStats(**{**stats.__dict__, "eta_seconds": None}))


def test_token_ids_outside_the_vocabulary_are_refused_on_the_host_naming_the_sample():
    def sample(index: int) -> dict:
        tokens = torch.full((8,), index % 100)
        if index == 13:
            tokens[3] = 130
        return {"tokens": tokens}

    def collate(rows):
        return {"tokens": torch.stack([r["tokens"] for r in rows])}

    ok = list(micro_batches(sample, collate, consumed=0, micro=2, dp=2, dp_rank=0, num_micro=2, vocab_size=128))
    assert [b["tokens"][:, 0].tolist() for b in ok] == [[0, 1], [4, 5]]
    assert all(b["tokens"].device.type == "cpu" for b in ok)
    # the global batch at 12: rank 0's micro-batch holds samples 12 and 13
    with pytest.raises(DataError, match=r"data.dataPath: sample 13 of the run holds token id 130, outside the "
                                        r"model's vocabulary \(128\)"):
        list(micro_batches(sample, collate, consumed=12, micro=2, dp=2, dp_rank=0, num_micro=1, vocab_size=128))


def test_grpo_prompt_rows_of_any_length_are_checked_too():
    def collate(rows):
        return {"prompts": rows, "references": [[1]] * len(rows)}

    prompts = {0: [1, 2], 1: [3], 2: [4, 5, 6], 3: [7, 300]}
    assert len(list(micro_batches(prompts.get, collate, 0, 2, 1, 0, 1, 128))) == 1
    with pytest.raises(DataError, match=r"sample 3 of the run holds token id 300"):
        list(micro_batches(prompts.get, collate, 2, 2, 1, 0, 1, 128))
