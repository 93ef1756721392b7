"""Resume: 10 steps straight equal 5 steps + resume + 5 steps (model, optimizer, scheduler, RNG, data position)."""
from __future__ import annotations

import pytest
import torch

from test_train_torchrun import TINY, assert_ok, run_train

# Same processes, same thread count, same data: the resumed run repeats the straight run's arithmetic, so the
# losses agree to float32 round-off (a lost optimizer state or data position moves them by 1e-2 or more).
TOLERANCE = 1e-5


@pytest.mark.engine
def test_resume_continues_exactly(tmp_path):
    config = {**TINY, "training": {**TINY["training"], "trainIters": 10},
              "optimizer": {"lr": 3e-3, "lrDecayStyle": "cosine", "lrWarmupIters": 2}}
    straight_dir, resumed_dir = tmp_path / "straight", tmp_path / "resumed"

    proc, straight = run_train(tmp_path, {**config, "checkpoint": {"save": str(straight_dir)}}, name="a.yaml")
    assert_ok(proc)
    proc, first = run_train(tmp_path, {**config, "checkpoint": {"save": str(resumed_dir)}}, "--exit-interval", "5",
                            name="b.yaml")
    assert_ok(proc)
    assert [s[0] for s in first] == [1, 2, 3, 4, 5]
    assert (resumed_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "5"

    proc, second = run_train(tmp_path, {**config, "checkpoint": {"save": str(resumed_dir), "load": str(resumed_dir)}},
                             name="c.yaml")
    assert_ok(proc)
    assert "loaded checkpoint" in proc.stdout
    assert [(s[0], s[1]) for s in second] == [(i, 4 * i) for i in range(6, 11)], "iteration or data position lost"
    for (it, _, a), (_, _, b) in zip(straight[5:], second):
        assert abs(a - b) <= TOLERANCE * max(1.0, abs(a)), f"iteration {it}: straight {a} vs resumed {b}"
    assert (resumed_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "10"

    final_a = torch.load(straight_dir / "iter_0000010/mp_rank_00/model_optim_rng.pt", weights_only=False)["model"]
    final_b = torch.load(resumed_dir / "iter_0000010/mp_rank_00/model_optim_rng.pt", weights_only=False)["model"]
    for key, value in final_a.items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(final_b[key], value, rtol=1e-5, atol=1e-6, msg=key)

    # Fine-tuning from the checkpoint: weights only, iteration 0, and the loss starts where training left off.
    proc, tuned = run_train(tmp_path, {**config, "training": {**config["training"], "trainIters": 2},
                                       "optimizer": {"lr": 1e-3},
                                       "checkpoint": {"load": str(resumed_dir), "finetune": True}}, name="d.yaml")
    assert_ok(proc)
    assert [s[0] for s in tuned] == [1, 2]
    assert tuned[0][2] < 0.8 * straight[0][2], (tuned, straight[0])
