"""Process reward model (``stage: prm``): the loss at the placeholders against transformers, layout parity, learning.

A tiny random HF Qwen3 language model is converted to Megatron-core at TP=1, TP=2 and PP=2. The real PRM stage
trains each from the same weights on a learnable process reward set (a step is "+" when the token before its
placeholder lies in the lower half of the vocabulary), prepared from text records by ``ascend-engine preprocess``
with AlpacaStyleProcessRewardHandler. "+" and "-" are tokens 5 and 250, in different halves of
the vocabulary, so at TP=2 their logits live on different ranks. Every sample has the same number of steps, so a
step's loss is the mean over all its placeholders whatever the micro-batch split. Checks: the loss at step 0
equals the cross-entropy of transformers' logits restricted to the two reward columns at the placeholders; TP=2
and PP=2 loss curves equal TP=1's within float32's rounding over the way the loss travelled (tests/float_bounds.py)
and their accuracy curves are equal; the step accuracy reaches 1.0.
Run as a script, this file is the worker; one torchrun trains the TP=2 and the PP=2 run.
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
from float_bounds import assert_curves_agree, forward_atol, model_delta  # noqa: E402

SAMPLES = 8
STEPS_PER_SAMPLE = 3
PLACEHOLDER, PLUS, MINUS = 3, 5, 250
ITERS = 20


def _write_tokenizer(directory: Path, vocab: int) -> None:
    """A word-level tokenizer whose "+", "-" and "ки" have the ids above."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab)} | {"ки": PLACEHOLDER, "+": PLUS, "-": MINUS}
    words = {w: i for w, i in words.items() if not (w.startswith("t") and int(w[1:]) in (PLACEHOLDER, PLUS, MINUS))}
    tok = Tokenizer(models.WordLevel(words, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0").save_pretrained(directory)


def _samples(vocab: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(input_ids, labels): steps of 2-4 tokens each ending in the placeholder, labels unshifted."""
    rng = np.random.default_rng(3)
    ordinary = [t for t in range(10, vocab) if t not in (PLUS, MINUS)]
    half = vocab // 2
    samples = []
    for _ in range(SAMPLES):
        ids, labels = [], []
        for _ in range(STEPS_PER_SAMPLE):
            step = list(rng.choice(ordinary, rng.integers(2, 5)))
            ids += step + [PLACEHOLDER]
            labels += [-100] * len(step) + [PLUS if step[-1] < half else MINUS]
        samples.append((np.array(ids), np.array(labels)))
    return samples


def _prepare_data(root: Path, samples) -> None:
    """The samples as records of text, through ``ascend-engine preprocess`` (AlpacaStyleProcessRewardHandler)."""
    from prep_support import preprocess, read_dataset, write_jsonl

    names = {PLACEHOLDER: "ки", PLUS: "+", MINUS: "-"}
    records = [{"input": " ".join(names.get(t, f"t{t}") for t in ids),
                "value": [names[t] for t in labels if t != -100]} for ids, labels in samples]
    assert preprocess("--input", write_jsonl(root / "prm.jsonl", records), "--tokenizer-name-or-path",
                      root / "tokenizer", "--output-prefix", root / "prm", "--handler-name",
                      "AlpacaStyleProcessRewardHandler", "--reward-tokens", "+", "-") == 0
    for key, index in (("input_ids", 0), ("labels", 1)):
        assert [r.tolist() for r in read_dataset(f"{root}/prm_packed_{key}_document")] == \
            [s[index].tolist() for s in samples]


def _config(root: Path, model: dict, tp: int, pp: int) -> Path:
    cfg = {"device": "cpu", "stage": "prm", "model": model,
           "parallel": {"tensorModelParallelSize": tp, "pipelineModelParallelSize": pp},
           "training": {"microBatchSize": SAMPLES // 2, "globalBatchSize": SAMPLES, "seqLength": 16,
                        "trainIters": ITERS},
           "optimizer": {"lr": 1e-2, "lrDecayStyle": "constant", "clipGrad": 1.0},
           "data": {"dataPath": [str(root / "prm")], "split": "100,0,0", "isInstructionDataset": True,
                    "tokenizerNameOrPath": str(root / "tokenizer")},
           "preference": {"rewardTokens": ["+", "-"]},
           "checkpoint": {"load": str(root / f"lm_tp{tp}_pp{pp}"), "finetune": True},
           "observability": {"metricsPort": 0}}
    path = root / f"prm_tp{tp}_pp{pp}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _launch(procs: int, *configs: Path) -> list[list[dict]]:
    """One process, or one torchrun of ``procs``, that trains each config in turn; their step metrics."""
    from test_train_torchrun import free_port

    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")}
    launcher = [sys.executable] if procs == 1 else [
        str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", str(procs), "--master-addr", "127.0.0.1",
        "--master-port", str(free_port())]
    proc = subprocess.run([*launcher, __file__, *map(str, configs)], capture_output=True, text=True, timeout=300,
                          env={**env, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-5000:]
    runs = dict(json.loads(line) for line in proc.stdout.splitlines() if line.startswith('["'))
    return [runs[str(config)] for config in configs]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from ascend_engine.cli import main
    from ascend_engine.convert.hf_config import model_config_from_hf
    from test_convert_models import make_hf_model

    root = tmp_path_factory.mktemp("prm")
    hf = make_hf_model("qwen3", root / "lm", num_hidden_layers=2)
    vocab = hf.config.vocab_size
    _write_tokenizer(root / "tokenizer", vocab)
    samples = _samples(vocab)
    _prepare_data(root, samples)
    model = model_config_from_hf(json.loads((root / "lm" / "config.json").read_text()), "config.json").to_yaml_dict()
    layouts = {(1, 1): 1, (2, 1): 2, (1, 2): 2}
    for tp, pp in layouts:
        assert main(["convert", "--load-dir", str(root / "lm"), "--save-dir", str(root / f"lm_tp{tp}_pp{pp}"),
                     "--target-tensor-parallel-size", str(tp), "--target-pipeline-parallel-size", str(pp)]) == 0
    (single,) = _launch(1, _config(root, model, 1, 1))
    tp2, pp2 = _launch(2, _config(root, model, 2, 1), _config(root, model, 1, 2))  # one torchrun, both layouts
    # float32 rounding of this model over 16 tokens: sqrt(K = 300, the vocabulary) x (2 layers + 2) x 2**-24
    return hf, samples, {(1, 1): single, (2, 1): tp2, (1, 2): pp2}, model_delta(model, 16)


@pytest.mark.engine
def test_prm_step0_loss_matches_transformers(runs):
    hf, samples, metrics, d = runs
    columns, targets = [], []
    with torch.no_grad():
        for ids, labels in samples:
            logits = hf(torch.tensor([ids])).logits[0].double()
            at = labels != -100
            columns.append(logits[torch.from_numpy(at)][:, [PLUS, MINUS]])
            targets.append(torch.from_numpy((labels[at] == MINUS).astype(np.int64)))
    expected = torch.nn.functional.cross_entropy(torch.cat(columns), torch.cat(targets)).item()
    # one forward of the same weights, summed in another order: within delta (4.1e-6) of the loss (float_bounds);
    # measured 1.9e-8 (AVX-512 kernels) and 4.1e-8 (AVX2's, TP=2) off, under 0.02 of the bound
    for layout, curve in metrics.items():
        assert curve[0]["lm loss"] == pytest.approx(expected, abs=forward_atol(expected, d)), layout


@pytest.mark.engine
def test_prm_layouts_agree_and_learn(runs):
    _, _, metrics, d = runs
    reference = metrics[(1, 1)]
    for layout in ((2, 1), (1, 2)):
        # The loss falls from 1.35 to 5e-4, travelling about 2.0: each step's difference is bounded by delta
        # times the loss plus the way it travelled, not by a share of the loss (1e-5 relative failed on an AMD
        # EPYC at 0.0461, 6.8e-7 off: 0.08 of the bound there, 8.3e-6, where the former allowance was 5.6e-7; at
        # the first step the bound is 2.9e-6 against the former 7.1e-6). Measured on an Intel Xeon: at most 0.11 of
        # the bound with AVX-512 kernels, 0.09 with AVX2's; the single run with a 1% larger learning rate, a far
        # smaller error than a layout bug makes, leaves it by up to 1265x.
        used = assert_curves_agree([m["lm loss"] for m in reference], [m["lm loss"] for m in metrics[layout]], d,
                                   f"lm loss at tp, pp = {layout}")
        print(f"tp, pp = {layout}: {used:.2f} of the float32 bound used")
        # a placeholder's prediction flips only at a margin within rounding of zero: the same count
        count = SAMPLES * STEPS_PER_SAMPLE
        assert [round(m["steps/accuracy"] * count) for m in metrics[layout]] == \
            [round(m["steps/accuracy"] * count) for m in reference], f"accuracy at tp, pp = {layout}"
    losses = [m["lm loss"] for m in reference]
    assert reference[-1]["steps/accuracy"] == 1.0, [m["steps/accuracy"] for m in reference]
    assert losses[-1] < losses[0] / 4, losses


def _worker(configs: list[str]) -> None:
    """ITERS optimizer steps of each config in turn (the process group kept, Megatron's groups rebuilt); prints
    ``[config, each step's metrics]`` per config from the rank that holds them."""
    from megatron.core import parallel_state

    from ascend_engine.config.train import TrainConfig
    from ascend_engine.device import select_backend
    from ascend_engine.parallel import destroy_parallel
    from ascend_engine.train.loop import Trainer

    for config in configs:
        trainer = Trainer(TrainConfig.model_validate(yaml.safe_load(open(config))), select_backend("cpu"))
        metrics = []
        for _ in range(ITERS):
            trainer.train_step()
            metrics.append(trainer.last_metrics)
        if torch.distributed.is_initialized() is False or torch.distributed.get_rank() == 0:
            print(json.dumps([config, metrics]), flush=True)
        parallel_state.destroy_model_parallel()
    destroy_parallel()


if __name__ == "__main__":
    from rank_process import run_rank

    run_rank(_worker, sys.argv[1:])
