"""TP=2, PP=2 (1F1B) and DP=2 with the distributed optimizer reproduce the single-process losses.

The weights come from the layout-independent initialisation (same seed -> same model under any layout) and
every layout reads the same global batches, so the runs differ only in the order of floating-point sums
(tensor-parallel all-reduces, split matmuls): the losses agree to about 1e-6; we allow 1e-4 relative, far
below the ~5e-2 a wrong shard, a missing gradient all-reduce or a skipped micro-batch moves them.
"""
from __future__ import annotations

import pytest

from test_train_torchrun import TINY, assert_ok, run_train

TOLERANCE = 1e-4
CONFIG = {**TINY, "model": {**TINY["model"], "paddedVocabSize": 128},
          "training": {**TINY["training"], "microBatchSize": 1, "globalBatchSize": 4, "trainIters": 4}}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    proc, steps = run_train(tmp_path_factory.mktemp("single"), CONFIG, nproc=1)
    assert_ok(proc)
    return [s[2] for s in steps]


@pytest.mark.engine
@pytest.mark.parametrize("layout,flags,files", [
    ("tp2", ["--tensor-model-parallel-size", "2"], ["mp_rank_00/model_optim_rng.pt", "mp_rank_01/model_optim_rng.pt"]),
    ("pp2", ["--pipeline-model-parallel-size", "2"],
     ["mp_rank_00_000/model_optim_rng.pt", "mp_rank_00_001/model_optim_rng.pt"]),
    ("dp2", ["--use-distributed-optimizer"], ["mp_rank_00/distrib_optim.pt", "mp_rank_00/model_optim_rng.pt"]),
])
def test_layout_matches_single_process(tmp_path, reference, layout, flags, files):
    proc, steps = run_train(tmp_path, {**CONFIG, "checkpoint": {"save": str(tmp_path / "ckpt")}}, *flags)
    assert_ok(proc)
    losses = [s[2] for s in steps]
    assert len(losses) == len(reference) == 4
    for i, (a, b) in enumerate(zip(reference, losses), start=1):
        assert abs(a - b) <= TOLERANCE * abs(a), f"{layout} iteration {i}: single {a} vs {b}"
    assert losses[-1] < losses[0]
    folder = tmp_path / "ckpt" / "iter_0000004"
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*.pt")) == files
