"""Training on real prepared data: `ascend-engine preprocess` output, blended and split, pretrain and SFT.

Corpora are prepared with the real preprocess command and a tiny BPE trained here (the preprocessing tests'
helpers). Runs are single-process unless parallelism is what is checked; each is a few steps of a tiny model.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from float_bounds import assert_curves_agree, model_delta
from test_train_torchrun import LINE, TINY, assert_ok, run_train

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from prep_support import CORPUS, build_tokenizer, preprocess, write_jsonl  # noqa: E402

MODEL = {**TINY["model"], "vocabSize": 400, "paddedVocabSize": 512}
# Phrases of the tokenizer's corpus, so samples stay short (about 30 tokens with the chat template).
QA = [("The quick brown fox?", "jumps over the lazy dog."), ("Give three tips.", "Eat well, sleep, exercise."),
      ("Megatron indexed datasets?", "hold tokens back to back."), ("user assistant system", "tool response input")]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    tok = build_tokenizer(root / "tok")
    half = len(CORPUS) // 2
    for name, lines in (("a", CORPUS[:half]), ("b", CORPUS[half:])):
        assert preprocess("--input", write_jsonl(root / f"{name}.jsonl", [{"text": t} for t in lines]),
                          "--tokenizer-name-or-path", tok, "--output-prefix", root / name, "--append-eod") == 0
    records = [{"instruction": q, "input": "", "output": a} for q, a in QA]
    path = write_jsonl(root / "sft.jsonl", records)
    common = ["--input", path, "--tokenizer-name-or-path", tok, "--handler-name", "AlpacaStyleInstructionHandler",
              "--prompt-type", "qwen", "--seq-length", "256"]
    assert preprocess(*common, "--output-prefix", root / "sft") == 0
    assert preprocess(*common, "--output-prefix", root / "neat", "--neat-pack") == 0
    return root


def run_single(tmp_path: Path, cfg: dict, *flags: str) -> tuple[list[float], str]:
    """``ascend-engine train`` as one process (no torchrun); returns the logged losses and stdout."""
    path = tmp_path / "single.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")}
    proc = subprocess.run([sys.executable, "-m", "ascend_engine.cli", "train", "--config", str(path), *flags],
                          capture_output=True, text=True, timeout=120, env={**env, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [float(m[4]) for m in LINE.finditer(proc.stdout)], proc.stdout


def config(data: dict, **training) -> dict:
    return {**TINY, "model": MODEL, "data": data,
            "training": {**TINY["training"], "microBatchSize": 2, "globalBatchSize": 4, **training}}


@pytest.mark.engine
def test_pretrain_on_blended_data_learns_and_resumes_exactly(tmp_path, prepared):
    data = {"dataPath": ["0.7", str(prepared / "a"), "0.3", str(prepared / "b")], "split": "90,10,0"}
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    cfg = config(data, trainIters=10)
    losses, _ = run_single(tmp_path, cfg | {"checkpoint": {"save": str(straight)}})
    assert len(losses) == 10 and losses[-1] < 0.8 * losses[0], losses
    first, _ = run_single(tmp_path, cfg | {"checkpoint": {"save": str(resumed)}}, "--exit-interval", "5")
    assert (resumed / "latest_checkpointed_iteration.txt").read_text().strip() == "5"  # --exit-interval saved
    second, out = run_single(tmp_path, cfg | {"checkpoint": {"save": str(resumed), "load": str(resumed)}})
    assert "loaded checkpoint" in out and "consumed samples:           24" in out
    assert first == losses[:5]
    np.testing.assert_allclose(second, losses[5:], rtol=1e-5, err_msg="resume did not continue at the same sample")


@pytest.mark.engine
def test_sft_with_pipeline_and_variable_lengths_learns_the_responses(tmp_path, prepared):
    cfg = config({"dataPath": [str(prepared / "sft")], "isInstructionDataset": True, "variableSeqLengths": True,
                  "padToMultipleOf": 8}, trainIters=12, seqLength=128)
    proc, steps = run_train(tmp_path, cfg, "--pipeline-model-parallel-size", "2")
    assert_ok(proc)
    losses = [s[2] for s in steps]
    assert len(losses) == 12 and losses[-1] < 0.5 * losses[0], losses


def write_sequences(prefix: Path, rows: list[tuple[list[int], list[int]]]) -> None:
    from ascend_engine.prep.indexed import IndexedDatasetWriter

    for key, pick in (("input_ids", lambda r: r[0]), ("attention_mask", lambda r: [1] * len(r[0])),
                      ("labels", lambda r: r[1])):
        w = IndexedDatasetWriter(f"{prefix}_packed_{key}_document", np.int32)
        w.add(np.concatenate([pick(r) for r in rows]).astype(np.int32), np.array([len(r[0]) for r in rows]))
        w.finish()
        w.commit()


@pytest.mark.engine
def test_sft_loss_ignores_tokens_labelled_minus_100(tmp_path, prepared):
    """Same samples, but the tokens after each response (the next user turn: -100 labels) differ between A
    and B. A trainer that took loss on them would see different targets; ours must produce identical losses."""
    rng = np.random.default_rng(0)
    rows_a, rows_b = [], []
    for _ in range(4):
        prompt, reply = rng.integers(5, 400, 12).tolist(), rng.integers(5, 400, 10).tolist()
        labels = [-100] * 12 + reply
        for rows in (rows_a, rows_b):
            tail = rng.integers(5, 400, 15).tolist()
            rows.append((prompt + reply + tail, labels + [-100] * 15))
    write_sequences(tmp_path / "a", rows_a)
    write_sequences(tmp_path / "b", rows_b)
    results = []
    for name in ("a", "b"):
        cfg = config({"dataPath": [str(tmp_path / name)], "isInstructionDataset": True}, trainIters=2, seqLength=40)
        results.append(run_single(tmp_path, cfg)[0])
    assert len(results[0]) == 2
    np.testing.assert_allclose(results[1], results[0], rtol=1e-6)


@pytest.mark.engine
def test_neat_packed_samples_train_as_if_apart(tmp_path, prepared):
    """One neat-packed sequence holding all samples trains like the same samples unpacked in one micro-batch:
    attention and positions stay inside each sample. The losses agree within float32's rounding over the way they
    travelled (tests/float_bounds.py: sqrt(K = 512, the padded vocabulary) x (2 layers + 2) x 2**-24 = 5.4e-6 of
    it, about 3e-5 here, and the log line's last digit; the former 2e-5 of the loss was 1e-4); treating the pack as
    one sequence (attention across samples, positions running on) moves them by about 3e-3 by the fourth step."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    packed = IndexedDataset(str(prepared / "neat_packed_attention_mask_document"))
    assert len(packed) == 1 and int(np.max(packed[0])) == len(QA), "all samples in one sequence"
    apart = config({"dataPath": [str(prepared / "sft")], "isInstructionDataset": True}, microBatchSize=4,
                   globalBatchSize=4, trainIters=4, seqLength=256)
    together = config({"dataPath": [str(prepared / "neat")], "isInstructionDataset": True, "neatPack": True},
                      microBatchSize=1, globalBatchSize=1, trainIters=4, seqLength=256)
    loss_apart = run_single(tmp_path, apart)[0]
    loss_together = run_single(tmp_path, together)[0]
    assert len(loss_apart) == len(loss_together) == 4
    used = assert_curves_agree(loss_apart, loss_together, model_delta(MODEL, 256), "packed", from_log=True)
    print(f"neat packing: {used:.2f} of the float32 bound used")


@pytest.mark.engine
def test_token_ids_beyond_the_vocabulary_stop_the_run_naming_the_sample(tmp_path, prepared):
    """The tokenizer has 400 ids; a model configured for 96 (padded to 128) must refuse, not index out of range."""
    cfg = config({"dataPath": [str(prepared / "a")]}, trainIters=2) | {"model": {**MODEL, "vocabSize": 96,
                                                                               "paddedVocabSize": 128}}
    path = tmp_path / "small_vocab.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")}
    proc = subprocess.run([sys.executable, "-m", "ascend_engine.cli", "train", "--config", str(path)],
                          capture_output=True, text=True, timeout=120, env={**env, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert re.search(r"bad training data: data.dataPath: sample \d+ of the run holds token id \d+, outside the "
                     r"model's vocabulary \(128\)", proc.stderr), proc.stderr[-4000:]
    assert not LINE.search(proc.stdout)
