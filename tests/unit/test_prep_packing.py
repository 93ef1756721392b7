"""Packing invariants, checked against the same samples written unpacked; the pure helpers on their own."""
from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

from prep_support import preprocess, read_dataset, tokenizer_dir, write_jsonl  # noqa: F401

from ascend_engine.prep.encode import split_budget
from ascend_engine.prep.packing import greedy_groups

SEQ = 64


def records(n: int = 40) -> list[dict]:
    rng = random.Random(0)
    words = "the quick brown fox jumps over lazy dog eat well sleep".split()
    return [{"instruction": " ".join(rng.choices(words, k=rng.randint(1, 12))),
             "output": " ".join(rng.choices(words, k=rng.randint(1, 10)))} for _ in range(n)]


def dataset(prefix: str, key: str) -> list[list[int]]:
    return [a.tolist() for a in read_dataset(f"{prefix}_packed_{key}_document")]


def run(tmp_path: Path, tokenizer_dir, name: str, *extra: str) -> str:
    prefix = tmp_path / name
    assert preprocess("--input", write_jsonl(tmp_path / "in.jsonl", records()), "--tokenizer-name-or-path",
                      tokenizer_dir, "--output-prefix", prefix, "--handler-name", "AlpacaStyleInstructionHandler",
                      "--prompt-type", "chatml", "--seq-length", SEQ, "--chunk-size", "16", *extra) == 0
    return str(prefix)


def test_neat_and_plain_packing_hold_every_sample_once(tmp_path, tokenizer_dir):
    plain_prefix = run(tmp_path, tokenizer_dir, "unpacked")
    samples = list(zip(map(tuple, dataset(plain_prefix, "input_ids")), map(tuple, dataset(plain_prefix, "labels"))))
    assert all(len(s[0]) < SEQ for s in samples)  # short enough that packing never truncates

    neat = run(tmp_path, tokenizer_dir, "neat", "--neat-pack")
    ids, masks, labels = (dataset(neat, k) for k in ("input_ids", "attention_mask", "labels"))
    assert len(ids) < len(samples)
    found = []
    for seq_ids, mask, seq_labels in zip(ids, masks, labels):
        assert len(seq_ids) == len(mask) == len(seq_labels) == SEQ
        used = [m for m in mask if m]
        k = max(used)
        assert used == sorted(used) and set(used) == set(range(1, k + 1))  # samples 1..k back to back
        assert mask[len(used):] == [0] * (SEQ - len(used)) and len(used) <= SEQ - 1  # padding last, >= 1 slot
        assert seq_ids[len(used):] == [0] * (SEQ - len(used))  # the pad token (<|endoftext|> is id 0 here)
        assert seq_labels[len(used):] == [-100] * (SEQ - len(used))
        for j in range(1, k + 1):
            span = [i for i, m in enumerate(mask) if m == j]
            found.append((tuple(seq_ids[span[0]:span[-1] + 1]), tuple(seq_labels[span[0]:span[-1] + 1])))
    assert Counter(found) == Counter(samples)

    packed = run(tmp_path, tokenizer_dir, "packed", "--pack")
    assert dataset(packed, "input_ids") == ids and dataset(packed, "labels") == labels
    assert all(m == [1] * SEQ for m in dataset(packed, "attention_mask"))


def test_greedy_groups_fill_each_sequence_with_the_longest_fit():
    lengths = [5, 9, 3, 7, 2, 9, 1]
    groups = greedy_groups(lengths, 10)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in g) <= 10 for g in groups)
    assert groups[0] == [1, 6]  # the longest (earliest of equals) first, then what still fits
    assert [lengths[i] for i in groups[1]] == [9]


def test_split_budget_keeps_short_sides_whole():
    assert split_budget(10, 5, 100) == (10, 5)
    assert split_budget(100, 5, 20) == (15, 5)  # a short reply stays whole
    assert split_budget(5, 100, 20) == (5, 15)  # a short prompt stays whole
    assert split_budget(60, 40, 20) == (12, 8)  # both long: in proportion
    assert split_budget(10_000, 15, 20)[1] >= 1
