"""Elastic data parallelism and trustworthy checkpoints, in one sequence of real torchrun runs (fp32, CPU):

a run at data-parallel size 2 is the reference. A second run resumes its iteration-2 checkpoint at DP 1 (a node
lost, no spare capacity): same global batch in twice the micro-batches, the distributed optimizer's shards
resharded on load. It keeps only the last 2 checkpoints. Its newest checkpoint is then truncated, and a third
run at DP 2 again (capacity back) falls back, loudly, to the one before and scales back out. Both continuations
must have the reference's loss curve within 1e-5 relative.
"""
from __future__ import annotations

import json
import shutil

import pytest
from test_train_torchrun import TINY, assert_ok, run_train

pytestmark = pytest.mark.engine
TOLERANCE = 1e-5  # other reduction orders over the same samples: float32 round-off, no more


def _assert_same_curve(reference, steps, what):
    by_iteration = {it: (consumed, loss) for it, consumed, loss in reference}
    worst = 0.0
    for it, consumed, loss in steps:
        ref_consumed, ref_loss = by_iteration[it]
        assert consumed == ref_consumed, f"iteration {it}: data position {consumed}, reference {ref_consumed}"
        assert abs(loss - ref_loss) <= TOLERANCE * abs(ref_loss), f"iteration {it}: {loss} vs reference {ref_loss}"
        worst = max(worst, abs(loss - ref_loss) / abs(ref_loss))
    print(f"{what}: largest relative loss difference from the DP 2 run {worst:.2e} (log lines carry 7 digits)")


def test_scale_in_and_out_keeps_the_loss_curve_and_a_damaged_checkpoint_falls_back(tmp_path):
    config = {**TINY, "parallel": {"useDistributedOptimizer": True},
              "training": {**TINY["training"], "trainIters": 6},
              "optimizer": {"lr": 3e-3, "lrDecayStyle": "cosine", "lrWarmupIters": 2}}
    reference_dir, elastic = tmp_path / "reference", tmp_path / "elastic"
    proc, reference = run_train(tmp_path, {**config, "checkpoint": {"save": str(reference_dir), "saveInterval": 2}},
                                nproc=2, name="reference.yaml")
    assert_ok(proc)
    assert [s[0] for s in reference] == list(range(1, 7))

    elastic.mkdir()
    shutil.copytree(reference_dir / "iter_0000002", elastic / "iter_0000002")
    (elastic / "latest_checkpointed_iteration.txt").write_text("2\n")
    resumed = {**config, "checkpoint": {"save": str(elastic), "load": str(elastic), "saveInterval": 2,
                                        "keepLastCheckpoints": 2}}
    proc, smaller = run_train(tmp_path, resumed, "--exit-interval", "5", nproc=1, name="smaller.yaml")
    assert_ok(proc)
    assert "data-parallel size 2 -> 1: the same global batch of 4 samples in 2 micro-batches" in proc.stdout
    assert [s[0] for s in smaller] == [3, 4, 5]
    _assert_same_curve(reference, smaller, "DP 2 -> 1 at iteration 2")
    assert sorted(p.name for p in elastic.iterdir()) == ["iter_0000004", "iter_0000005",
                                                         "latest_checkpointed_iteration.txt"]

    damaged = elastic / "iter_0000005" / "mp_rank_00" / "model_optim_rng.pt"
    damaged.write_bytes(damaged.read_bytes()[:1000])
    proc, larger = run_train(tmp_path, resumed, nproc=2, name="larger.yaml")
    assert_ok(proc)
    assert (f"WARNING checkpoint {elastic}: iteration 5 is damaged ({damaged}: truncated: 1000 bytes, the manifest "
            "says") in proc.stderr, proc.stderr[-3000:]
    event = next(json.loads(line.split("ascend-event: ", 1)[1]) for line in proc.stderr.splitlines()
                 if "ascend-event: " in line)
    assert event["type"] == "Warning" and event["reason"] == "CheckpointFallback" and str(damaged) in event["message"]
    assert "resuming from iteration 4" in event["message"]
    assert "data-parallel size 1 -> 2" in proc.stdout
    assert [s[0] for s in larger] == [5, 6]
    _assert_same_curve(reference, larger, "DP 1 -> 2 at iteration 4")
