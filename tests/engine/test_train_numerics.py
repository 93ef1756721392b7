"""Numerics-aware recovery on real data under torchrun (CPU, DP2): a poisoned window of garbage samples makes the
loss spike; the run rolls back to its checkpoint, skips that window and trains on as if the data never held it; a
second poisoned window, with the rollbacks used up, ends the run with NumericFault; a restart with one more rollback
allowed keeps the record and ends with the losses of the run whose data never held either window."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from test_train_torchrun import free_port, run_train

VOCAB, SEQ, BATCH, ITERS = 96, 32, 4, 20
SEED = 1234  # training.seed: it also orders the instruction dataset's samples


def write_sequences(prefix: Path, rows: list[np.ndarray]) -> None:
    from ascend_engine.prep.indexed import IndexedDatasetWriter

    for key, fill in (("input_ids", None), ("attention_mask", 1), ("labels", None)):
        w = IndexedDatasetWriter(f"{prefix}_packed_{key}_document", np.int32)
        w.add(np.concatenate([r if fill is None else np.full_like(r, fill) for r in rows]).astype(np.int32),
              np.array([len(r) for r in rows]))
        w.finish()
        w.commit()


def write_in_run_order(prefix: Path, samples: list[np.ndarray]) -> None:
    """Rows stored so that the run reads ``samples[i]`` as its sample i: the instruction dataset reads row
    ``RandomState(seed).permutation(n)[i]`` as sample i of the first epoch (data/instruction.py)."""
    order = np.random.RandomState(SEED).permutation(len(samples))
    rows: list[np.ndarray] = [np.empty(0)] * len(samples)
    for i, row in enumerate(order):
        rows[int(row)] = samples[i]
    write_sequences(prefix, rows)


def config(prefix: Path, tmp_path: Path, name: str) -> dict:
    return {
        "device": "cpu",
        "model": {"numLayers": 2, "hiddenSize": 64, "numAttentionHeads": 4, "vocabSize": VOCAB},
        "training": {"microBatchSize": 2, "globalBatchSize": BATCH, "seqLength": SEQ, "trainIters": ITERS,
                     "seed": SEED},
        "optimizer": {"lr": 1e-2, "lrDecayStyle": "constant"},
        "data": {"dataPath": [str(prefix)], "isInstructionDataset": True},
        "checkpoint": {"save": str(tmp_path / f"ckpt-{name}"), "saveInterval": 4},
        "numerics": {"maxRollbacks": 1, "lossSpikeFactor": 3.0, "lossSpikeWindow": 4},
        "observability": {"metricsPort": 0},
    }


@pytest.mark.engine
def test_a_poisoned_window_is_rolled_back_skipped_and_the_run_matches_one_without_it(tmp_path):
    import torch

    rng = np.random.RandomState(0)
    pattern = rng.randint(0, VOCAB, 17)
    clean = [np.roll(pattern, -(5 * j) % 17)[np.arange(SEQ + 1) % 17] for j in range(96)]
    garbage = [rng.randint(0, VOCAB, SEQ + 1) for _ in range(2 * BATCH)]
    # Iteration i reads samples 4(i-1)..4i-1, so iteration 11 reads the first window (40-43). Once it is skipped,
    # iteration i >= 11 reads samples 4i..4i+3 (clean sample 4(i-1) onwards): the second window is iteration 18's.
    poisoned = clean[:40] + garbage[:BATCH] + clean[40:68] + garbage[BATCH:] + clean[68:]
    write_in_run_order(tmp_path / "clean", clean)
    write_in_run_order(tmp_path / "poisoned", poisoned)

    proc, steps = run_train(tmp_path, config(tmp_path / "clean", tmp_path, "clean"), name="clean.yaml")
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = {i: loss for i, _, loss in steps}
    assert sorted(reference) == list(range(1, ITERS + 1)) and "numerics:" not in proc.stdout

    termination = tmp_path / "termination-log"
    os.environ["ASCEND_TERMINATION_LOG"] = str(termination)
    try:
        proc, steps = run_train(tmp_path, config(tmp_path / "poisoned", tmp_path, "poisoned"), name="poisoned.yaml")
    finally:
        del os.environ["ASCEND_TERMINATION_LOG"]
    out = proc.stdout + proc.stderr

    # The first window: detected at iteration 11, rolled back to the checkpoint of iteration 8, skipped.
    assert ("numerics: iteration 11 (samples 40-43 of the run): loss spike" in proc.stdout
            and "rolled back to iteration 8" in proc.stdout and "2 step(s) to train again" in proc.stdout
            and "rollback 1 of 1" in proc.stdout), out[-4000:]
    assert "NumericRollback" in proc.stderr  # the event line the operator posts on the job
    seen = [i for i, _, _ in steps]
    assert seen == [*range(1, 11), *range(9, 18)], seen  # 9 and 10 trained twice, 11 never logged as poisoned
    consumed = {i: c for i, c, _ in steps}
    assert consumed[10] == 40 and consumed[11] == 48 and consumed[16] == 68  # 4 samples skipped
    first_pass = [loss for i, _, loss in steps[:10]]
    replayed = [loss for i, _, loss in steps[10:12]]
    assert replayed == first_pass[8:10], "the replay after the rollback is not exact"

    # Parity: every iteration's loss is the clean run's, within 1e-5 relative.
    losses = {i: loss for i, _, loss in steps}
    for i in range(1, 18):
        assert losses[i] == pytest.approx(reference[i], rel=1e-5), (i, losses[i], reference[i])
    assert reference[16] < 0.5 * reference[1]

    # The second window, with the one rollback used: the run fails as NumericFault naming the iteration and samples.
    assert proc.returncode != 0
    assert "exitcode  : 2 " in proc.stderr, proc.stderr[-3000:]  # the engine's deliberate refusal: no restart fixes it
    report = json.loads(termination.read_text())
    assert report["reason"] == "NumericFault" and report["iteration"] == 18 and report["samples"] == [72, 76]
    assert "iteration 18 (samples 72-75 of the run)" in report["message"] and "maxRollbacks (1)" in report["message"]

    # The record in the checkpoints written after the rollback, so a restart keeps skipping.
    root = tmp_path / "ckpt-poisoned"
    assert (root / "latest_checkpointed_iteration.txt").read_text().strip() == "16"
    state = torch.load(root / "iter_0000016" / "mp_rank_00" / "model_optim_rng.pt", weights_only=False)
    assert state["args"].consumed_train_samples == 68
    record = state["numerics"]
    assert record["rollbacks"] == 1
    assert [(w["iteration"], w["first_sample"], w["end_sample"]) for w in record["skipped_windows"]] == [(11, 40, 44)]
    assert [i for i, _ in record["recent_losses"]] == [13, 14, 15, 16]

    # A restart from that checkpoint with one more rollback allowed keeps the record: it skips the first window
    # already passed, counts the second rollback as the second, and ends with the clean run's losses.
    resumed = config(tmp_path / "poisoned", tmp_path, "poisoned")
    resumed["checkpoint"]["load"] = resumed["checkpoint"]["save"]
    resumed["numerics"]["maxRollbacks"] = 2
    resumed["observability"]["metricsPort"] = free_port()  # rank 0's last figures become the termination message
    os.environ["ASCEND_TERMINATION_LOG"] = str(termination)
    try:
        proc, steps = run_train(tmp_path, resumed, name="resumed.yaml")
    finally:
        del os.environ["ASCEND_TERMINATION_LOG"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(termination.read_text())  # what the operator copies into status.progress
    assert {k: figures.get(k) for k in ("numericRollbacks", "skippedSamples", "skippedWindowIteration",
                                        "skippedWindowFirstSample", "skippedWindowEndSample")} == {
        "numericRollbacks": 2, "skippedSamples": 8, "skippedWindowIteration": 18, "skippedWindowFirstSample": 72,
        "skippedWindowEndSample": 76}
    assert "numerics: iteration 18 (samples 72-75 of the run)" in proc.stdout and "rolled back to iteration 16" in \
        proc.stdout and "rollback 2 of 2" in proc.stdout, proc.stdout[-3000:]
    losses = {i: loss for i, _, loss in steps}
    assert sorted(losses) == [17, 18, 19, 20] and steps[-1][1] == ITERS * BATCH + 2 * BATCH
    for i in range(17, ITERS + 1):
        assert losses[i] == pytest.approx(reference[i], rel=1e-5), (i, losses[i], reference[i])
