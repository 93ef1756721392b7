"""A numerics rollback restores exactly the state of a run that never saw the skipped window: with a warm-up and a
cosine decay (megatron-core's own OptimizerParamScheduler), dropout drawing from the RNG, fp32 and fp16 (dynamic loss
scaling), under torchrun on CPU (DP2).

The reference is a run on the same data without the poisoned window: the run that skipped the same batches. After the
rollback the poisoned run must log, at every iteration number, that run's learning rate and loss, and its later
checkpoints must hold that run's scheduler, optimizer (Adam moments, loss scaler), RNG and weights.

Why the bound is zero: the two runs do the same float32 (or float16) operations in the same order on the same
samples: one thread per process (``OMP_NUM_THREADS=1``), the same two-rank gloo all-reduce, and a checkpoint restores
every tensor bit for bit (``torch.save``/``torch.load``). IEEE-754 arithmetic is then deterministic, so any
difference, even one ulp, is a state the rollback did not restore, not float round-off. (A float32 budget, n * 2^-24
relative for a sum of n terms in another order, belongs to comparisons of different computations, such as TP2 against
TP1; none happens here.) The size of what it catches: one scheduler step too many changes the cosine rate by at least
1e-4 relative here, which the 7 digits of the log show, and the loss after it in the 5th digit.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from test_train_numerics import SEED, VOCAB, write_in_run_order
from test_train_torchrun import run_train

SEQ, BATCH, ITERS, WARMUP = 32, 4, 20, 4
LOG = re.compile(r"iteration\s+(\d+)/.*?\| consumed samples:\s+(\d+) .*?\| learning rate: (\S+) \|.*?"
                 r"\| lm loss: (\S+) \|(?:.*? loss scale: (\S+) \|)?")


def config(prefix: Path, tmp_path: Path, name: str, precision: str) -> dict:
    return {
        "device": "cpu",
        "model": {"numLayers": 2, "hiddenSize": 64, "numAttentionHeads": 4, "vocabSize": VOCAB,
                  "hiddenDropout": 0.1},  # dropout draws from the RNG every step: the rollback must restore it
        "training": {"microBatchSize": 2, "globalBatchSize": BATCH, "seqLength": SEQ, "trainIters": ITERS,
                     "seed": SEED, "precision": precision},
        "optimizer": {"lr": 1e-2, "minLr": 1e-3, "lrDecayStyle": "cosine", "lrWarmupIters": WARMUP},
        "data": {"dataPath": [str(prefix)], "isInstructionDataset": True},
        "checkpoint": {"save": str(tmp_path / f"ckpt-{name}"), "saveInterval": 4},
        "numerics": {"maxRollbacks": 1, "lossSpikeFactor": 3.0, "lossSpikeWindow": 4},
        "observability": {"metricsPort": 0},
    }


def logged(stdout: str) -> list[tuple[int, int, str, str, str | None]]:
    """(iteration, consumed samples, learning rate, loss, loss scale) per log line, as printed."""
    return [(int(m[1]), int(m[2]), m[3], m[4], m[5]) for m in LOG.finditer(stdout)]


def assert_same(a, b, where: str) -> None:
    """Equal bit for bit: nested dicts / lists / tuples of tensors, arrays and plain values."""
    import torch

    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (where, set(a) ^ set(b) if isinstance(b, dict) else b)
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), f"{where}: largest difference {(a.double() - b.double()).abs().max().item()}"
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b), where
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    else:
        assert a == b, (where, a, b)


@pytest.mark.engine
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_after_a_rollback_the_run_is_the_one_that_never_saw_the_window(tmp_path, precision):
    import torch

    rng = np.random.RandomState(0)
    pattern = rng.randint(0, VOCAB, 17)
    clean = [np.roll(pattern, -(5 * j) % 17)[np.arange(SEQ + 1) % 17] for j in range(96)]
    garbage = [rng.randint(0, VOCAB, SEQ + 1) for _ in range(BATCH)]
    # Iteration i reads samples 4(i-1)..4i-1: iteration 11 reads the poisoned window (samples 40-43).
    write_in_run_order(tmp_path / "clean", clean)
    write_in_run_order(tmp_path / "poisoned", clean[:40] + garbage + clean[40:])

    proc, _ = run_train(tmp_path, config(tmp_path / "clean", tmp_path, "clean", precision), name="clean.yaml",
                        timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = {line[0]: line for line in logged(proc.stdout)}
    assert sorted(reference) == list(range(1, ITERS + 1)) and "numerics:" not in proc.stdout, proc.stdout[-3000:]

    proc, _ = run_train(tmp_path, config(tmp_path / "poisoned", tmp_path, "poisoned", precision),
                        name="poisoned.yaml", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("numerics: iteration 11 (samples 40-43 of the run): loss spike" in proc.stdout
            and "rolled back to iteration 8" in proc.stdout), proc.stdout[-4000:]
    lines = logged(proc.stdout)
    assert [line[0] for line in lines] == [*range(1, 11), *range(9, ITERS + 1)], [line[0] for line in lines]
    after = lines[10:]  # from the first step after the rollback (iteration 9 again) to the end

    # The schedule is warm-up then cosine (not the constant rate the numerics test uses), and really decays.
    rates = [float(reference[i][2]) for i in range(1, ITERS + 1)]
    assert rates[:WARMUP] == pytest.approx([1e-2 * i / WARMUP for i in range(1, WARMUP + 1)], rel=1e-6)
    assert rates[WARMUP] > rates[12] > rates[-1] == pytest.approx(1e-3)

    for iteration, consumed, lr, loss, scale in after:
        _, clean_consumed, clean_lr, clean_loss, clean_scale = reference[iteration]
        assert lr == clean_lr, f"iteration {iteration}: learning rate {lr} after the rollback, {clean_lr} without it"
        assert loss == clean_loss, f"iteration {iteration}: lm loss {loss} after the rollback, {clean_loss} without it"
        assert scale == clean_scale, f"iteration {iteration}: loss scale {scale}, {clean_scale} without the window"
        assert consumed == clean_consumed + (BATCH if iteration >= 11 else 0), (iteration, consumed, clean_consumed)
    if precision == "fp16":
        assert all(line[4] is not None for line in after)

    # Every checkpoint written after the rollback holds the state of the run without the window: the scheduler's
    # step count and schedule, the optimizer (Adam's moments and step, the fp16 loss scaler's scale and trackers),
    # every rank's RNG, the weights; the data position is past the window.
    # numpy's generator is the exception: building the datasets (96 and 100 samples) draws from it differently, and
    # training never does, so each run's stays what it was at its first checkpoint.
    def state(run: str, iteration: int) -> dict:
        path = tmp_path / f"ckpt-{run}" / f"iter_{iteration:07d}" / "mp_rank_00" / "model_optim_rng.pt"
        return torch.load(path, weights_only=False)

    first = state("poisoned", 4)
    for iteration in (12, 16, 20):
        ours, theirs = state("poisoned", iteration), state("clean", iteration)
        assert ours["opt_param_scheduler"]["num_steps"] == theirs["opt_param_scheduler"]["num_steps"], iteration
        for key in ("opt_param_scheduler", "optimizer", "model"):
            assert_same(ours[key], theirs[key], f"iteration {iteration} {key}")
        for rank, (mine, other) in enumerate(zip(ours["rng_state"], theirs["rng_state"], strict=True)):
            assert_same({k: v for k, v in mine.items() if k != "np_rng_state"},
                        {k: v for k, v in other.items() if k != "np_rng_state"}, f"iteration {iteration} rng {rank}")
            assert_same(mine["np_rng_state"], first["rng_state"][rank]["np_rng_state"], f"numpy {iteration} {rank}")
        assert ours["args"].consumed_train_samples == theirs["args"].consumed_train_samples + BATCH
    # dropout does draw from torch's generator every step, so its equality above is no accident of an idle one
    later = state("poisoned", 12)["rng_state"][0]["torch_rng_state"]
    assert not torch.equal(first["rng_state"][0]["torch_rng_state"], later)
