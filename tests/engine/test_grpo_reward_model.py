"""GRPO with an outcome reward model as its reward (``grpo.rewardModel``).

An ORM is trained with the real ``stage: orm`` on pairs whose chosen replies use the lower half of the vocabulary
(``test_train_orm``'s learnable set), so it scores lower-half tokens high. Then:

- the rewards GRPO uses for its rollout rows equal the ORM's scores of those rows computed by a separate process
  through the ORM stage's own model and reading (``stage: orm``, ``sequence_rewards``), times the weight;
- a GRPO run whose only reward is the ORM raises the ORM's score of its responses;
- TP=2 and PP=2 (torchrun, 2 processes, the ORM resharded by ``ascend-engine convert``) give the same rollout
  rows, reward model scores and rewards as one process;
- a language-model checkpoint (no score head) is refused with its path named.

Scores agree within float32's rounding of one forward (tests/float_bounds.py): delta = sqrt(K = 512, the padded
vocabulary) x (2 layers + 2) x 2**-24 = 5.4e-6 of the largest |score| (a score is a dot product of the last hidden
state, summed from terms about its own size); the former allowance was 1e-5 + 1e-5 of the value. The step's
metrics at TP=2 / PP=2: the score statistics within delta of the largest |score| x WEIGHT, the entropy within delta
of itself, the loss within delta of 2 ln 512 / sqrt(32 rows) (a mean of advantage-weighted ratios
exp(logp - logp_old) near zero, made of log-probabilities of about ln 512: test_train_grpo.py); the former allowance
was 1e-6 + 1e-4 of the value.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from float_bounds import curve_atol, forward_atol, model_delta
from test_train_grpo import MODEL, grpo_config, prompts, run, steps  # noqa: F401 - prompts is a fixture
from test_train_orm import PAIRS, _write_pairs
from test_train_torchrun import TINY, VENV_BIN, free_port

WEIGHT = 2.0
DELTA = model_delta(MODEL, 32)

# The first GRPO step's rollout rows, for one or several layouts in one launch (its start-up costs more than a
# layout's step): argv holds pairs of config and output path; each config builds its own Trainer, Megatron's groups
# rebuilt, the process group kept. Rank 0 writes the rows to the output path and its metrics next to it.
CAPTURE = textwrap.dedent("""
    import json, sys, yaml, torch
    from megatron.core import parallel_state
    from ascend_engine.config.train import TrainConfig
    from ascend_engine.device import select_backend
    from ascend_engine.parallel import destroy_parallel
    from ascend_engine.train.loop import Trainer
    from ascend_engine.train.stages import rollout
    captured = []
    real = rollout.roll_out
    def recording(*args, **kwargs):
        out = real(*args, **kwargs)
        captured.append(out)
        return out
    rollout.roll_out = recording
    for config, out in zip(sys.argv[1::2], sys.argv[2::2]):
        captured.clear()
        trainer = Trainer(TrainConfig.model_validate(yaml.safe_load(open(config))), select_backend("cpu"))
        trainer.train_step()
        r = captured[0]
        if torch.distributed.get_rank() == 0:
            torch.save({"tokens": r.tokens, "loss_mask": r.loss_mask, "rewards": r.rewards,
                        "model_scores": r.model_scores}, out)
        if torch.distributed.get_rank() == 0:  # a file: the two ranks' stdout lines interleave in torchrun's
            with open(out + ".metrics.json", "w") as f:
                json.dump(trainer.last_metrics, f)
        torch.distributed.barrier()  # no rank leaves while another still talks to it (gloo aborts otherwise)
        parallel_state.destroy_model_parallel()
    destroy_parallel()
""")

ORM_SCORES = textwrap.dedent("""
    import sys, json, yaml, torch
    from ascend_engine.config.train import TrainConfig
    from ascend_engine.device import select_backend
    from ascend_engine.train.loop import Trainer
    from ascend_engine.train.stages.base import model_inputs
    from ascend_engine.train.stages.reward import sequence_rewards
    trainer = Trainer(TrainConfig.model_validate(yaml.safe_load(open(sys.argv[1]))), select_backend("cpu"))
    rows = torch.load(sys.argv[2])
    batch = {"tokens": rows["tokens"], "loss_mask": rows["loss_mask"]}
    trainer.model.eval()
    with torch.no_grad():
        scores = trainer.model(*model_inputs(trainer, trainer.model, batch))
    print(json.dumps(sequence_rewards(scores, batch["loss_mask"]).tolist()))
""")


def orm_config(root: Path, load: str | None, save: str | None) -> dict:
    return {**TINY, "model": MODEL, "stage": "orm",
            "training": {"microBatchSize": PAIRS // 2, "globalBatchSize": PAIRS, "seqLength": 32, "trainIters": 12},
            "optimizer": {"lr": 3e-3, "lrDecayStyle": "constant", "clipGrad": 1.0},
            "data": {"dataPath": [str(root / "pairs")], "split": "100,0,0"},
            "checkpoint": {"load": load, "save": save}}


@pytest.fixture(scope="module")
def orm(tmp_path_factory) -> tuple[Path, Path]:
    """An ORM (TP=1) preferring lower-half tokens, and the same checkpoint resharded to TP=2 and to PP=2."""
    from ascend_engine.cli import main

    root = tmp_path_factory.mktemp("orm")
    _write_pairs(root, MODEL["vocabSize"])
    run(root, orm_config(root, None, str(root / "orm")))
    assert main(["convert", "--load-model-type", "mg", "--save-model-type", "mg", "--load-dir", str(root / "orm"),
                 "--save-dir", str(root / "orm_tp2"), "--target-tensor-parallel-size", "2"]) == 0
    assert main(["convert", "--load-model-type", "mg", "--save-model-type", "mg", "--load-dir", str(root / "orm"),
                 "--save-dir", str(root / "orm_pp2"), "--target-pipeline-parallel-size", "2"]) == 0
    return root / "orm", {"tensorModelParallelSize": root / "orm_tp2", "pipelineModelParallelSize": root / "orm_pp2"}


def rm_config(prompts, orm_path: Path, **training) -> dict:  # noqa: F811 - the fixture's value
    cfg = grpo_config(prompts, nSamplesPerPrompt=8, klCoef=0.01, verifierFunction=[], rewardModel=str(orm_path),
                      rewardModelWeight=WEIGHT)
    cfg["training"].update({"globalBatchSize": 4, "trainIters": 20, **training})
    return cfg


def capture(tmp: Path, configs: dict[str, dict], nproc: int) -> dict[str, tuple[dict, dict]]:
    """The first GRPO step's rollout rows (rank 0's) and metrics of each config, in one launch of ``nproc``
    processes."""
    argv = []
    for name, cfg in configs.items():
        (tmp / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
        argv += [str(tmp / f"{name}.yaml"), str(tmp / f"rows-{name}.pt")]
    (tmp / "capture.py").write_text(CAPTURE)
    launcher = [sys.executable] if nproc == 1 else [
        str(VENV_BIN / "torchrun"), "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port",
        str(free_port())]
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")}
    proc = subprocess.run([*launcher, str(tmp / "capture.py"), *argv], capture_output=True, text=True, timeout=300,
                          env={**env, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return {name: (torch.load(tmp / f"rows-{name}.pt"), json.loads((tmp / f"rows-{name}.pt.metrics.json").read_text()))
            for name in configs}


@pytest.fixture(scope="module")
def tp1_rollout(prompts, orm, tmp_path_factory):  # noqa: F811
    """The first GRPO step in one process (``layout_rollouts``: TP=2, PP=2)."""
    return capture(tmp_path_factory.mktemp("tp1_rollout"), {"tp1": rm_config(prompts, orm[0], trainIters=1)}, 1)["tp1"]


@pytest.mark.engine
def test_grpo_rewards_are_the_orm_scores(tmp_path, orm, tp1_rollout):
    """The rewards of one rollout = WEIGHT x the ORM stage's own scores of the same rows (another process)."""
    rows, _ = tp1_rollout
    torch.save(rows, tmp_path / "rows.pt")
    assert rows["tokens"].shape[0] == 8 * 4
    scorer = orm_config(orm[0].parent, str(orm[0]), None)
    proc = run(tmp_path, scorer, script=ORM_SCORES.replace("sys.argv[2]", repr(str(tmp_path / "rows.pt"))))
    theirs = np.array(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert np.ptp(theirs) > 1e-3  # the responses are told apart
    atol = forward_atol(theirs, DELTA)
    print(f"scores {np.abs(rows['model_scores'].numpy() - theirs).max():.1e} apart, bound {atol:.1e}")
    np.testing.assert_allclose(rows["model_scores"].numpy(), theirs, rtol=0, atol=atol)
    np.testing.assert_allclose(rows["rewards"].numpy(), WEIGHT * theirs, rtol=0, atol=WEIGHT * atol)


@pytest.fixture(scope="module")
def learning(prompts, orm, tmp_path_factory) -> list[dict[str, float]]:  # noqa: F811
    return steps(run(tmp_path_factory.mktemp("rm_learning"), rm_config(prompts, orm[0])).stdout)


@pytest.mark.engine
def test_reward_model_only_grpo_raises_the_score(learning):
    scores = [s["grpo/reward_model_score"] for s in learning]
    assert len(scores) == 20
    assert all(s["grpo/reward_mean"] == pytest.approx(WEIGHT * s["grpo/reward_model_score"], rel=1e-3)
               for s in learning)
    assert np.mean(scores[-5:]) > np.mean(scores[:5]) + 0.5, scores


LAYOUTS = ["tensorModelParallelSize", "pipelineModelParallelSize"]


@pytest.fixture(scope="module")
def layout_rollouts(prompts, orm, tmp_path_factory) -> dict:  # noqa: F811
    """The first GRPO step's rollout rows (rank 0's) and metrics at TP=2 and at PP=2: one torchrun, 2 processes."""
    configs = {layout: {**rm_config(prompts, orm[1][layout], trainIters=1), "parallel": {layout: 2}}
               for layout in LAYOUTS}
    return capture(tmp_path_factory.mktemp("layout_rollouts"), configs, 2)


@pytest.mark.engine
@pytest.mark.parametrize("layout", LAYOUTS, ids=["tp2", "pp2"])
def test_layouts_give_the_single_process_rewards(layout_rollouts, tp1_rollout, layout):
    """The first step at TP=2 / PP=2: the same rollouts scored alike by the resharded ORM (at PP=2 rank 0 is the
    first stage: its scores come from the last stage's broadcast).

    Only the first step: the scores differ between layouts by rounding (~1e-7) and so do the advantages; Adam
    turns such differences in near-zero gradient components into full-size steps, so from the second step on the
    policies (and their samples) part, unlike with rule rewards, which are exact."""
    rows, b = layout_rollouts[layout]
    ours, a = tp1_rollout
    assert torch.equal(rows["tokens"], ours["tokens"])  # the same rollouts
    atol = forward_atol(ours["model_scores"], DELTA)
    print(f"{layout}: scores {(rows['model_scores'] - ours['model_scores']).abs().max():.1e} apart, bound {atol:.1e}")
    np.testing.assert_allclose(rows["model_scores"].numpy(), ours["model_scores"].numpy(), rtol=0, atol=atol)
    np.testing.assert_allclose(rows["rewards"].numpy(), ours["rewards"].numpy(), rtol=0, atol=WEIGHT * atol)
    score_scale = WEIGHT * float(ours["model_scores"].abs().max())
    for key, scale in (("grpo/reward_model_score", score_scale), ("grpo/reward_mean", score_scale),
                       ("grpo/reward_std", score_scale), ("grpo/entropy", 0.0),
                       ("lm loss", 2 * np.log(MODEL["paddedVocabSize"]) / np.sqrt(32))):  # 4 prompts x 8
        (bound,) = curve_atol([a[key]], DELTA, scale)
        assert abs(b[key] - a[key]) <= bound, (key, a[key], b[key], bound)


@pytest.mark.engine
def test_a_checkpoint_without_score_head_is_refused(tmp_path, prompts, base):  # noqa: F811
    """A language model's checkpoint (conftest.py's ``base``) as the reward model: refused, naming it."""
    cfg = rm_config(prompts, base, trainIters=1)
    path = tmp_path / "refused.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "ascend_engine.cli", "train", "--config", str(path)],
                          capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0
    assert f"{base}: not a reward model" in proc.stderr + proc.stdout, proc.stderr[-3000:]
