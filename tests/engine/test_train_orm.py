"""Outcome reward model (``stage: orm``): training, export and parity with ``transformers``.

A tiny random HF Qwen3 language model is converted to Megatron-core at TP=2. The real ORM stage starts from it
(the LM head dropped, a seeded score head in its place), trains on a learnable pairwise set (chosen replies use
the lower half of the vocabulary, rejected ones the upper half) under torchrun at TP=2 and saves a checkpoint.
That checkpoint is exported with ``ascend-engine convert`` to a ``Qwen3ForSequenceClassification`` and resharded
to TP=1 and to PP=2. Checks: the ranking accuracy reaches 1.0; the exported config is a one-label classifier with
a padding token; ``AutoModelForSequenceClassification`` scores every reply as our engine rewards it, at TP=2 (the
trained model), at TP=1 and at PP=2 (the saved checkpoint, resharded), within float32's rounding of one forward
(tests/float_bounds.py: delta = sqrt(K = 300) x (2 layers + 2) x 2**-24 = 4.1e-6 of the largest |score|, a score being
a dot product of the last hidden state summed from terms about its size: 1.1e-5 for scores up to 2.7, where the
former 1e-4 + 1e-4 of each score was about 12x wider; measured 4.8e-7). Run as a script, this file is the worker.
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
from float_bounds import forward_atol, hf_delta  # noqa: E402

PROMPT = 5
PAIRS = 8
STEPS = 12


def _write_pairs(root: Path, vocab: int) -> None:
    from ascend_engine.prep.indexed import IndexedDatasetWriter

    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, vocab, PROMPT) for _ in range(PAIRS)]
    half = vocab // 2
    replies = {"chosen": [rng.integers(0, half, rng.integers(3, 8)) for _ in range(PAIRS)],
               "rejected": [rng.integers(half, vocab, rng.integers(3, 8)) for _ in range(PAIRS)]}
    for side, side_replies in replies.items():
        ids = [np.concatenate([p, r]) for p, r in zip(prompts, side_replies)]
        labels = [np.concatenate([np.full(PROMPT, -100), r]) for r in side_replies]
        for key, rows in (("input_ids", ids), ("attention_mask", [np.ones_like(i) for i in ids]),
                          ("labels", labels)):
            w = IndexedDatasetWriter(str(root / f"pairs_packed_{side}_{key}_document"), np.int32)
            w.add(np.concatenate(rows).astype(np.int32), np.array([len(r) for r in rows]))
            w.finish()
            w.commit()


def _config(root: Path, model: dict, tp: int, load: str, save: str | None, pp: int = 1) -> Path:
    cfg = {"device": "cpu", "stage": "orm", "model": model,
           "parallel": {"tensorModelParallelSize": tp, "pipelineModelParallelSize": pp},
           "training": {"microBatchSize": PAIRS // 2, "globalBatchSize": PAIRS, "seqLength": 16,
                        "trainIters": STEPS},
           "optimizer": {"lr": 3e-3, "lrDecayStyle": "constant", "clipGrad": 1.0},
           "data": {"dataPath": [str(root / "pairs")], "split": "100,0,0"},
           "checkpoint": {"load": load, "save": save, "finetune": True},
           "observability": {"metricsPort": 0}}
    path = root / f"orm_tp{tp}_pp{pp}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _launch(procs: int, mode: str, *configs: Path) -> list[dict]:
    """One process, or one torchrun of ``procs``, that runs ``mode`` on each config in turn; their results."""
    from test_train_torchrun import free_port

    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")}
    launcher = [sys.executable] if procs == 1 else [
        str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", str(procs), "--master-addr", "127.0.0.1",
        "--master-port", str(free_port())]
    proc = subprocess.run([*launcher, __file__, mode, *map(str, configs)], capture_output=True, text=True,
                          timeout=300, env={**env, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-5000:]
    runs = dict(json.loads(line) for line in proc.stdout.splitlines() if line.startswith('["'))
    return [runs[str(config)] for config in configs]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from ascend_engine.cli import main
    from ascend_engine.convert.hf_config import model_config_from_hf
    from test_convert_models import make_hf_model

    root = tmp_path_factory.mktemp("orm")
    make_hf_model("qwen3", root / "lm", num_hidden_layers=2)
    assert main(["convert", "--load-dir", str(root / "lm"), "--save-dir", str(root / "lm_tp2"),
                 "--target-tensor-parallel-size", "2"]) == 0
    hf_config = json.loads((root / "lm" / "config.json").read_text())
    model = model_config_from_hf(hf_config, "config.json").to_yaml_dict()
    _write_pairs(root, hf_config["vocab_size"])
    (tp2,) = _launch(2, "train", _config(root, model, 2, str(root / "lm_tp2"), str(root / "orm_tp2")))
    assert main(["convert", "--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", str(root / "orm_tp2"),
                 "--save-dir", str(root / "orm_hf"), "--model-type-hf", "qwen3",
                 "--tokenizer-model", str(root / "lm")]) == 0
    assert main(["convert", "--load-model-type", "mg", "--save-model-type", "mg", "--load-dir", str(root / "orm_tp2"),
                 "--save-dir", str(root / "orm_tp1"), "--padded-vocab-size", "384"]) == 0  # TP=1's padding
    assert main(["convert", "--load-model-type", "mg", "--save-model-type", "mg", "--load-dir", str(root / "orm_tp2"),
                 "--save-dir", str(root / "orm_pp2"), "--target-pipeline-parallel-size", "2",
                 "--padded-vocab-size", "384"]) == 0
    # one torchrun scores both (TP=1's two processes are data-parallel replicas; the first one reports)
    tp1, pp2 = _launch(2, "score", _config(root, model, 1, str(root / "orm_tp1"), None),
                       _config(root, model, 1, str(root / "orm_pp2"), None, pp=2))
    return root, tp2, tp1, pp2


@pytest.mark.engine
def test_orm_learns_to_rank(trained):
    _, tp2, _, _ = trained
    accuracies = [m["rewards/accuracies"] for m in tp2["metrics"]]
    losses = [m["lm loss"] for m in tp2["metrics"]]
    assert accuracies[-1] == 1.0, accuracies
    assert losses[-1] < losses[0] and losses[-1] < 0.3, losses
    chosen, rejected = np.array(tp2["rewards"]).reshape(2, PAIRS)
    assert (chosen > rejected).all()


@pytest.mark.engine
def test_orm_export_scores_match_transformers(trained):
    from transformers import AutoModelForSequenceClassification

    root, tp2, tp1, pp2 = trained
    config = json.loads((root / "orm_hf" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForSequenceClassification"]
    assert len(config["id2label"]) == 1 and config["pad_token_id"] is not None
    hf = AutoModelForSequenceClassification.from_pretrained(root / "orm_hf").eval()
    assert hf.num_labels == 1
    with torch.no_grad():
        theirs = [hf(torch.tensor([tokens])).logits[0, 0].item() for tokens in tp2["tokens"]]
    # the same rows (the trained checkpoint) at TP=2 in the training run, resharded to TP=1 and to PP=2
    assert tp1["tokens"] == tp2["tokens"] == pp2["tokens"]
    atol = forward_atol(theirs, hf_delta(root / "orm_hf" / "config.json", 16))
    for layout in (tp2, tp1, pp2):
        print(f"scores {np.abs(np.array(layout['rewards']) - theirs).max():.1e} from transformers', bound {atol:.1e}")
        np.testing.assert_allclose(layout["rewards"], theirs, rtol=0, atol=atol)
    # HF finds each row's last real token through pad_token_id: a padded batch scores the same
    pad = config["pad_token_id"]
    tokens = tp2["tokens"][:2]
    width = max(map(len, tokens))
    padded = torch.tensor([t + [pad] * (width - len(t)) for t in tokens])
    with torch.no_grad():
        batched = hf(padded, attention_mask=(padded != pad).long()).logits[:, 0]
    np.testing.assert_allclose(batched.tolist(), theirs[:2], rtol=0, atol=atol)


def _worker(mode: str, configs: list[str]) -> None:
    """For each config in turn (the process group kept, Megatron's groups rebuilt): train: STEPS optimizer steps,
    save, then score; score: the loaded checkpoint's rewards only. Prints ``[config, result]``: the step metrics,
    every reply's tokens (up to its last real token) and reward."""
    from ascend_engine.parallel import destroy_parallel

    for config in configs:
        _run(config, mode)
    destroy_parallel()


def _run(config: str, mode: str) -> None:
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from ascend_engine.config.train import TrainConfig
    from ascend_engine.device import select_backend
    from ascend_engine.models.score_head import last_token_index
    from ascend_engine.train.loop import Trainer
    from ascend_engine.train.stages.base import model_inputs
    from ascend_engine.train.stages.reward import sequence_rewards

    trainer = Trainer(TrainConfig.model_validate(yaml.safe_load(open(config))), select_backend("cpu"))
    metrics = []
    if mode == "train":
        for _ in range(STEPS):
            trainer.train_step()
            metrics.append(trainer.last_metrics)
        trainer.save()
    # every pair once, in dataset order (chosen rows first), through the pipeline schedule (forward only)
    batch = trainer.data.batch([trainer.data.datasets[0][i] for i in range(PAIRS)])

    def score_step(data_iterator, model):
        scores = model(*model_inputs(trainer, model, next(data_iterator)))
        return scores, lambda out: (out.new_zeros(()), {"rewards": sequence_rewards(out, batch["loss_mask"])})

    trainer.model.eval()
    with torch.no_grad():
        results = get_forward_backward_func()(
            forward_step_func=score_step, data_iterator=iter([batch]), model=[trainer.model], num_microbatches=1,
            seq_length=batch["tokens"].shape[1], micro_batch_size=2 * PAIRS, forward_only=True)
    ends = last_token_index(batch["loss_mask"])
    tokens = [row[: int(end) + 1].tolist() for row, end in zip(batch["tokens"], ends)]
    if results and trainer.info.tp_rank == 0 and trainer.info.dp_rank == 0:  # the last pipeline stage
        result = {"metrics": metrics, "rewards": results[0]["rewards"].tolist(), "tokens": tokens}
        print(json.dumps([config, result]), flush=True)
    parallel_state.destroy_model_parallel()


if __name__ == "__main__":
    from rank_process import run_rank

    run_rank(_worker, sys.argv[1], sys.argv[2:])
