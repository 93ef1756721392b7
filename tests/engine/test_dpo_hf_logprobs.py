"""The sequence log-probabilities DPO trains on equal an independent ``transformers`` computation.

A tiny random HF Qwen3 is converted to Megatron-core (TP=1 and TP=2); the real DPO stage (``Trainer`` with
``stage: dpo``, loading the conversion) computes the policy's and the reference's log-probabilities of both
replies of each pair, summed over the reply tokens only, through Megatron's vocab-parallel cross-entropy. The
test sums ``log_softmax`` of the HF model's logits over the same tokens, and the two agree within float32's
rounding of one forward (tests/float_bounds.py): delta = sqrt(K = 300, the vocabulary) x (4 layers + 2) x 2**-24 =
6.2e-6 times the sum's size, each reply token's log-probability about ln 384 (the padded vocabulary) and their
rounding adding as a random walk: sqrt(REPLY + 1) x ln 384 = 14.6, so 9.0e-5 for these sums of six tokens, about
-34 (the former 1e-5 of the value was about 3.4e-4); measured 4.1e-6 at TP=1 and 1.0e-6 at TP=2. Run as a script,
this file is the worker.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from float_bounds import hf_delta, logprob_scale  # noqa: E402

PROMPT, REPLY = 6, 5
PAIRS = 2


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from ascend_engine.cli import main
    from ascend_engine.convert.hf_config import model_config_from_hf
    from ascend_engine.prep.indexed import IndexedDatasetWriter
    from test_convert_models import FAMILY_CONFIGS, make_hf_model

    root = tmp_path_factory.mktemp("dpo_hf")
    hf = make_hf_model("qwen3", root / "hf")
    for tp in (1, 2):
        assert main(["convert", "--load-dir", str(root / "hf"), "--save-dir", str(root / f"tp{tp}"),
                     "--target-tensor-parallel-size", str(tp)]) == 0
    rng = np.random.default_rng(3)
    vocab = FAMILY_CONFIGS["qwen3"]["vocab_size"]
    sides = {}
    for side in ("chosen", "rejected"):
        rows = []
        for p in range(PAIRS):
            prompt = np.random.default_rng(p).integers(0, vocab, PROMPT)  # shared by both sides of pair p
            reply = rng.integers(0, vocab, REPLY + (1 if side == "rejected" else 0))
            rows.append((np.concatenate([prompt, reply]), np.concatenate([np.full(PROMPT, -100), reply])))
        sides[side] = rows
        for key, pick in (("input_ids", 0), ("attention_mask", None), ("labels", 1)):
            w = IndexedDatasetWriter(str(root / f"pairs_packed_{side}_{key}_document"), np.int32)
            data = [r[0] * 0 + 1 if pick is None else r[pick] for r in rows]
            w.add(np.concatenate(data).astype(np.int32), np.array([len(r[0]) for r in rows]))
            w.finish()
            w.commit()
    hf_config = json.loads((root / "hf" / "config.json").read_text())
    model = model_config_from_hf(hf_config, "config.json").to_yaml_dict()
    expected = {}
    with torch.no_grad():
        for side, rows in sides.items():
            for p, (ids, labels) in enumerate(rows):
                logp = torch.log_softmax(hf(torch.tensor(ids)[None]).logits[0].double(), -1)
                targets = torch.tensor(labels[1:])
                keep = targets != -100
                expected[(side, p)] = logp[:-1][keep, targets[keep]].sum().item()
    return root, model, expected


def _config(root: Path, model: dict, tp: int) -> Path:
    cfg = {"device": "cpu", "stage": "dpo", "model": model,
           "parallel": {"tensorModelParallelSize": tp},
           "training": {"microBatchSize": PAIRS, "globalBatchSize": PAIRS, "seqLength": 16, "trainIters": 1},
           "data": {"dataPath": [str(root / "pairs")], "split": "100,0,0"},
           "checkpoint": {"load": str(root / f"tp{tp}"), "finetune": True},
           "observability": {"metricsPort": 0}}
    path = root / f"tp{tp}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.engine
@pytest.mark.parametrize("tp", [1, 2])
def test_dpo_logprobs_match_transformers(converted, tp):
    from test_train_torchrun import free_port

    root, model, expected = converted
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")}
    launcher = [sys.executable] if tp == 1 else [
        str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(free_port())]
    proc = subprocess.run([*launcher, __file__, str(_config(root, model, tp))], capture_output=True, text=True,
                          timeout=180, env={**env, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-5000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for which in ("policy", "reference"):
        # the data is shuffled per epoch: match pairs by their reply log-probabilities, order-free
        ours = sorted(zip(got[which][:PAIRS], got[which][PAIRS:]))
        theirs = sorted((expected[("chosen", p)], expected[("rejected", p)]) for p in range(PAIRS))
        atol = hf_delta(root / "hf" / "config.json", 16) * logprob_scale(REPLY + 1, 384)
        print(f"tp{tp} {which}: {np.abs(np.array(ours) - np.array(theirs)).max():.1e} apart, bound {atol:.1e}")
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=atol, err_msg=which)


def _worker(config: str) -> None:
    """Build the real DPO trainer, take the first step's micro-batch, print policy and reference log-probs."""
    from ascend_engine.config.train import TrainConfig
    from ascend_engine.device import select_backend
    from ascend_engine.parallel import destroy_parallel
    from ascend_engine.train.loop import Trainer
    from ascend_engine.train.stages.base import per_token_loss

    trainer = Trainer(TrainConfig.model_validate(yaml.safe_load(open(config))), select_backend("cpu"))
    batch = trainer.data.batch([trainer.data.sample(i) for i in range(PAIRS)])
    [batch] = trainer.stage.prepare(iter([batch]))
    with torch.no_grad():
        out = per_token_loss(trainer, trainer.model, batch, real_vocab_only=True)
        policy = trainer.stage._logps(batch["loss_mask"], out)
    if trainer.info.rank == 0:
        print(json.dumps({"policy": policy.tolist(), "reference": batch["ref_logps"].tolist()}))
    destroy_parallel()


if __name__ == "__main__":
    from rank_process import run_rank

    run_rank(_worker, sys.argv[1])
