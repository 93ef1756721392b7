"""A tiny model that has memorised a small instruction set, trained once per test session (``conftest.py``'s
``memorised`` fixture) for the commands that load a trained checkpoint: ``evaluate`` answers the memorised MMLU
questions and no others, ``generate`` continues a memorised sentence.

Instruction data with the ``empty`` template: the loss is on the responses only, so a few dozen steps learn
them. The sentence is one record whose instruction is its start, so ``generate --prompt "The quick brown"`` sees
the very tokens the model was trained on. Trained at PP=2, the layout ``generate`` then runs at; ``evaluate``
reshards it on load.
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

from test_train_data import config
from test_train_torchrun import assert_ok, run_train

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from prep_support import build_tokenizer, preprocess, write_jsonl  # noqa: E402

SENTENCE_PROMPT, SENTENCE_REST = "The quick brown", " fox jumps over the lazy dog."
SENTENCE = SENTENCE_PROMPT + SENTENCE_REST
WORDS = ["quick", "brown", "fox", "lazy", "dog", "tips", "healthy", "sleep", "exercise", "tokens", "index",
         "datasets", "assistant", "system", "tool", "response"]
OPTIONS = ["jumps", "sleeps", "eats", "runs"]
# 8 questions learnt and 8 held out, answers balanced A-D in both; one subject each, so one evaluation run
# reports the two accuracies apart.
SEEN = [("seen", f"What does the {w} do?", OPTIONS, "ABCD"[i % 4]) for i, w in enumerate(WORDS[:8])]
HELD_OUT = [("held_out", f"What does the {w} do?", OPTIONS, "ABCD"[i % 4]) for i, w in enumerate(WORDS[8:])]


def write_mmlu(root: Path, questions: list[tuple[str, str, list[str], str]], dev: bool = True) -> Path:
    """MMLU's layout: ``test/<subject>_test.csv`` and ``dev/<subject>_dev.csv``, rows question,A,B,C,D,answer."""
    by_subject: dict[str, list] = {}
    for subject, q, options, answer in questions:
        by_subject.setdefault(subject, []).append([q, *options, answer])
    for subject, rows in by_subject.items():
        for split in ("test", "dev") if dev else ("test",):
            (root / split).mkdir(parents=True, exist_ok=True)
            with open(root / split / f"{subject}_{split}.csv", "w", newline="") as f:
                csv.writer(f).writerows(rows if split == "test" else rows[:1])
    return root / "test"


def train_memorised(root: Path) -> dict:
    """Tokenizer, the MMLU set (``seen`` and ``held_out`` subjects), the instruction data and a checkpoint trained
    on it under torchrun at PP=2. Returns their paths and the training run's logged losses."""
    from ascend_engine.evaluate.tasks import load_task

    tok = build_tokenizer(root / "tok")
    mmlu = write_mmlu(root / "mmlu", SEEN + HELD_OUT, dev=False)
    records = [{"instruction": q.context, "input": "", "output": q.options[q.gold]}
               for q in load_task("mmlu", str(mmlu), 0) if q.subject == "seen"]
    assert len(records) == len(SEEN)
    records.append({"instruction": SENTENCE_PROMPT, "input": "", "output": SENTENCE_REST})
    assert preprocess("--input", write_jsonl(root / "memorise.jsonl", records), "--tokenizer-name-or-path", tok,
                      "--output-prefix", root / "memorise", "--handler-name", "AlpacaStyleInstructionHandler",
                      "--prompt-type", "empty", "--seq-length", "128") == 0
    cfg = config({"dataPath": [str(root / "memorise")], "isInstructionDataset": True}, trainIters=70,
                 seqLength=128, microBatchSize=4, globalBatchSize=8) | {
                     "optimizer": {"lr": 3e-3, "lrDecayStyle": "constant"},
                     "checkpoint": {"save": str(root / "ckpt")}}
    proc, steps = run_train(root, cfg, "--pipeline-model-parallel-size", "2", timeout=300)
    assert_ok(proc)
    return {"tokenizer": tok, "mmlu": mmlu, "checkpoint": root / "ckpt", "losses": [s[2] for s in steps]}
