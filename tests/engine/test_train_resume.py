"""Resume: 10 steps straight equal 5 steps + resume + 5 steps (model, optimizer, scheduler, RNG, data position), bit
for bit; what a run does with a finished, a longer and a fine-tuned schedule on the same checkpoint."""
from __future__ import annotations

import math
import re
import shutil

import pytest
import torch

from test_train_torchrun import TINY, assert_ok, run_train

LR = re.compile(r"learning rate: (\S+) \|")


@pytest.mark.engine
def test_resume_continues_exactly(tmp_path):
    """DP 2, fp32, the distributed optimizer: the resumed run repeats the straight one bit for bit. Then, on the
    resumed checkpoint: a restart after the final iteration has nothing left to do; a longer schedule the run says
    wins picks up its learning rates; fine-tuning starts from its weights at iteration 0."""
    config = {**TINY, "parallel": {"useDistributedOptimizer": True},
              "training": {**TINY["training"], "trainIters": 10},
              "optimizer": {"lr": 3e-3, "minLr": 3e-5, "lrDecayStyle": "cosine", "lrWarmupIters": 2}}
    # --exit-interval's stop-and-save is checked in test_train_data (a torchrun here costs about 10 s).
    straight, second, stdout, straight_dir, resumed_dir = _resume_from_iteration_5(tmp_path, config, nproc=2)
    assert [(s[0], s[1]) for s in second] == [(i, 4 * i) for i in range(6, 11)], "iteration or data position lost"
    _assert_resumed_bitwise(straight, second, stdout, straight_dir, resumed_dir)
    assert (resumed_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "10"

    # A restart after the final checkpoint (a gang restart at the very end) has nothing left to do: it succeeds.
    resume = {"save": str(resumed_dir), "load": str(resumed_dir)}
    proc, again = run_train(tmp_path, {**config, "checkpoint": resume}, nproc=1, name="again.yaml")
    assert_ok(proc)
    assert again == [] and "at iteration 10 of 10: nothing left to train" in proc.stderr

    # Megatron-LM's rule: a different schedule is an error naming both values (tests/unit/test_train_resume_rules.py)
    # until the run says which wins.
    longer = {**config, "training": {**config["training"], "trainIters": 15}, "checkpoint": {"load": str(resumed_dir)}}
    proc, steps = run_train(tmp_path, longer, "--override-opt-param-scheduler", nproc=1, name="override.yaml")
    assert_ok(proc)
    assert [s[0] for s in steps] == list(range(11, 16))
    lrs = [float(x) for x in LR.findall(proc.stdout)]
    # The line after iteration i shows the rate for the next step: after 2 warm-up steps, cosine over the other
    # 13 from 3e-3 to 3e-5, picked up at step 11, not stuck at the 10-step schedule's floor.
    expected = [3e-5 + 0.5 * (3e-3 - 3e-5) * (1 + math.cos(math.pi * (i - 2) / 13)) for i in range(11, 16)]
    assert lrs == pytest.approx(expected, rel=1e-5)

    # Fine-tuning from the checkpoint: weights only, iteration 0, and the loss starts where training left off.
    proc, tuned = run_train(tmp_path, {**config, "training": {**config["training"], "trainIters": 2},
                                       "optimizer": {"lr": 1e-3},
                                       "checkpoint": {"load": str(resumed_dir), "finetune": True}}, name="d.yaml")
    assert_ok(proc)
    assert [s[0] for s in tuned] == [1, 2]
    assert tuned[0][2] < 0.8 * straight[0][2], (tuned, straight[0])


def _resume_from_iteration_5(tmp_path, config, *flags, nproc):
    """A straight 10-step run that saves at 5 and 10, and a second run resumed from its iteration-5 checkpoint.

    The checkpoint at 5 is written in the middle of the straight run, so the straight run's later iterations are
    exactly what a correct resume must repeat. Returns (straight steps, resumed steps, resumed stdout, dirs).
    """
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    proc, first = run_train(tmp_path, {**config, "checkpoint": {"save": str(straight), "saveInterval": 5}},
                            *flags, nproc=nproc, name="straight.yaml")
    assert_ok(proc)
    resumed.mkdir()
    shutil.copytree(straight / "iter_0000005", resumed / "iter_0000005")
    (resumed / "latest_checkpointed_iteration.txt").write_text("5\n")
    proc, second = run_train(tmp_path, {**config, "checkpoint": {"save": str(resumed), "load": str(resumed)}},
                             *flags, nproc=nproc, name="resumed.yaml")
    assert_ok(proc)
    return first, second, proc.stdout, straight, resumed


@pytest.mark.engine
def test_resume_with_tp2_dp2_bf16_and_the_distributed_optimizer_continues_bitwise(tmp_path):
    """ZeRO-1 resume with bf16's fp32 main-param copies (fp32's are views of the model's: the test above), TP 2 x
    DP 2: the sharded main params and Adam moments come back from distrib_optim.pt on every DP rank, so the
    resumed run repeats the straight one bit for bit."""
    config = {**TINY, "parallel": {"useDistributedOptimizer": True},
              "training": {**TINY["training"], "trainIters": 10, "precision": "bf16"},
              "optimizer": {"lr": 3e-3, "lrDecayStyle": "cosine", "lrWarmupIters": 2}}
    _assert_resumed_bitwise(*_resume_from_iteration_5(tmp_path, config, "--tensor-model-parallel-size", "2",
                                                      nproc=4))


def _assert_resumed_bitwise(straight, resumed, stdout, straight_dir, resumed_dir) -> None:
    """The resumed run logged the straight run's losses at the same data positions, and its final checkpoint
    equals the straight run's bit for bit on every rank: model, and the distributed optimizer's shards (it used
    to crash in megatron-core's loader in fp32)."""
    assert "loaded checkpoint" in stdout
    assert [s[0] for s in resumed] == list(range(6, 11))
    assert [(s[1], s[2]) for s in resumed] == [(s[1], s[2]) for s in straight[5:]], "losses or data position differ"
    assert "ETA:" in stdout
    for rank_dir in sorted(p for p in (straight_dir / "iter_0000010").iterdir() if p.is_dir()):
        other = resumed_dir / "iter_0000010" / rank_dir.name
        a = torch.load(rank_dir / "model_optim_rng.pt", weights_only=False)
        b = torch.load(other / "model_optim_rng.pt", weights_only=False)
        for key, value in a["model"].items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(b["model"][key], value), f"{rank_dir.name} {key}"
        shards_a = torch.load(rank_dir / "distrib_optim.pt", weights_only=False)
        shards_b = torch.load(other / "distrib_optim.pt", weights_only=False)
        flat_a, flat_b = _tensors(shards_a), _tensors(shards_b)
        assert flat_a.keys() == flat_b.keys() and flat_a
        for key in flat_a:
            assert torch.equal(flat_a[key], flat_b[key]), f"{rank_dir.name} optimizer state {key}"


def _tensors(tree, prefix="") -> dict:
    """Every tensor in a nested dict/list, by path."""
    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list | tuple) else ()
    out = {}
    for key, value in items:
        out.update(_tensors(value, f"{prefix}/{key}"))
    return out
