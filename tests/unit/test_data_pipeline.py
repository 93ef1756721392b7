"""Training data: dataPath parsing, --split, blending, pretraining windows and instruction batches.

Datasets are written with the preprocessing writer (the real MMIDIDX format) and read back through
megatron-core's IndexedDataset, as training reads them.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ascend_engine.data.batch import block_causal_mask, instruction_batch, segment_positions
from ascend_engine.data.blend import Blend
from ascend_engine.data.instruction import InstructionDataset
from ascend_engine.data.pretrain import PretrainDataset
from ascend_engine.data.sources import DataError, parse_data_path, parse_split, train_range
from ascend_engine.prep.indexed import IndexedDatasetWriter


def write(prefix, sequences, dtype=np.int32) -> str:
    w = IndexedDatasetWriter(str(prefix), dtype)
    w.add(np.concatenate(sequences), np.array([len(s) for s in sequences]))
    w.finish()
    w.commit()
    return str(prefix)


def test_data_path_weights_and_resolution(tmp_path):
    write(tmp_path / "a_text_document", [np.arange(10)])
    write(tmp_path / "b_text_document", [np.arange(10)])
    sources = parse_data_path(["0.7", str(tmp_path / "a"), "0.3", str(tmp_path / "b_text_document")], False)
    assert [round(s.weight, 6) for s in sources] == [0.7, 0.3]
    assert sources[1].files["text"] == str(tmp_path / "b_text_document")
    assert [s.weight for s in parse_data_path([str(tmp_path / "a"), str(tmp_path / "b")], False)] == [0.5, 0.5]
    with pytest.raises(DataError, match=r"data.dataPath: no dataset for prefix .*missing_text_document"):
        parse_data_path([str(tmp_path / "missing")], False)
    with pytest.raises(DataError, match="weight/prefix pairs"):
        parse_data_path(["0.7", str(tmp_path / "a"), "0.3"], False)
    with pytest.raises(DataError, match="not an instruction dataset"):
        parse_data_path([str(tmp_path / "a")], True)
    for key in ("input_ids", "attention_mask", "labels"):
        write(tmp_path / f"s_packed_{key}_document", [np.arange(5)])
    with pytest.raises(DataError, match="set data.isInstructionDataset"):
        parse_data_path([str(tmp_path / "s")], False)


def test_split_takes_the_leading_documents():
    assert parse_split("969,30,1") == pytest.approx([0.969, 0.03, 0.001])
    assert parse_split("98/2") == pytest.approx([0.98, 0.02, 0.0])
    assert train_range(10, "80,10,10") == range(0, 8)
    with pytest.raises(DataError, match="data.split"):
        parse_split("a,b")


def test_blend_follows_the_weights_at_every_prefix():
    blend = Blend([0.7, 0.3])
    picks = [blend[i] for i in range(1000)]
    for n in (10, 100, 1000):
        share = sum(d == 0 for d, _ in picks[:n]) / n
        assert abs(share - 0.7) <= 1.0 / n + 1e-9, (n, share)
    # within-dataset indices count up per dataset: every sample of each dataset used once, in order
    for d in (0, 1):
        assert [k for dd, k in picks if dd == d] == list(range(sum(dd == d for dd, _ in picks)))
    assert [Blend([0.7, 0.3])[i] for i in range(5000, 5010)] == [blend[i] for i in range(5000, 5010)]


def test_pretrain_windows_cover_the_training_documents(tmp_path):
    docs = [np.arange(100 * i, 100 * i + n) for i, n in enumerate([7, 30, 12, 25, 40, 9, 60, 5, 22, 18])]
    prefix = write(tmp_path / "c_text_document", docs, np.uint16)
    ds = PretrainDataset(prefix, seq_length=16, seed=5, split="80,20,0", name="c")
    train_tokens = sum(len(d) for d in docs[:8])
    assert ds.samples_per_epoch == (train_tokens - 1) // 16
    seen = []
    for i in range(ds.samples_per_epoch):
        text = ds[i]["text"]
        assert len(text) == 17
        seen.append(text)
    allowed = set(np.concatenate(docs[:8]).tolist())
    assert set(np.concatenate(seen).tolist()) <= allowed, "validation documents leaked into training"
    # windows are contiguous pieces of the concatenated documents: inside a document ids step by one
    steps = np.concatenate([np.diff(t) for t in seen])
    assert (steps == 1).mean() > 0.8
    # deterministic per index, and the next epoch reshuffles
    again = PretrainDataset(prefix, seq_length=16, seed=5, split="80,20,0", name="c")
    assert all(np.array_equal(again[i]["text"], seen[i]) for i in range(len(seen)))
    n = ds.samples_per_epoch
    assert any(not np.array_equal(ds[n + i]["text"], seen[i]) for i in range(n))
    with pytest.raises(DataError, match="fewer than seqLength"):
        PretrainDataset(prefix, seq_length=1000, seed=5, split="100,0,0", name="c")


def test_instruction_batch_trains_only_labelled_targets():
    ids = np.array([11, 12, 13, 14, 15, 16])
    labels = np.array([-100, -100, -100, 14, 15, 16])  # prompt 11..13, response 14..16
    batch = instruction_batch([{"input_ids": ids, "attention_mask": np.ones(6, dtype=np.int64), "labels": labels}],
                              seq_length=8)
    assert batch["tokens"].tolist() == [[11, 12, 13, 14, 15, 16, 0, 0]]
    # input t predicts label t+1: the targets 14, 15, 16 are predicted from 13, 14, 15
    assert batch["loss_mask"].tolist() == [[0, 0, 1, 1, 1, 0, 0, 0]]
    assert batch["labels"][0, 2:5].tolist() == [14, 15, 16]


def test_variable_lengths_pad_to_a_multiple():
    rows = [{"input_ids": np.arange(1, n + 1), "attention_mask": np.ones(n, dtype=np.int64),
             "labels": np.arange(1, n + 1)} for n in (5, 11)]
    assert instruction_batch(rows, seq_length=64, variable=True, pad_to_multiple_of=8)["tokens"].shape == (2, 16)
    assert instruction_batch(rows, seq_length=12, variable=True, pad_to_multiple_of=8)["tokens"].shape == (2, 12)
    assert instruction_batch(rows, seq_length=64)["tokens"].shape == (2, 64)


def test_neat_pack_keeps_samples_apart():
    # two samples (3 and 4 tokens) packed, then padding
    ids = np.array([1, 2, 3, 4, 5, 6, 7, 0, 0])
    segments = np.array([1, 1, 1, 2, 2, 2, 2, 0, 0])
    labels = np.array([-100, 2, 3, -100, 5, 6, 7, -100, -100])
    batch = instruction_batch([{"input_ids": ids, "attention_mask": segments, "labels": labels}], seq_length=8,
                              neat_pack=True)
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 0]]
    assert batch["loss_mask"].tolist() == [[1, 1, 0, 1, 1, 1, 0, 0]]
    mask = batch["attention_mask"][0, 0]
    visible = [(i, j) for i in range(8) for j in range(8) if not mask[i, j]]
    assert (4, 3) in visible and (4, 2) not in visible and (2, 3) not in visible and (3, 3) in visible
    assert all(j <= i for i, j in visible)
    assert segment_positions(torch.tensor([[5, 5, 5]])).tolist() == [[0, 1, 2]]
    assert block_causal_mask(torch.tensor([[1, 1]])).shape == (1, 1, 2, 2)


def test_instruction_dataset_reads_all_three_files(tmp_path):
    seqs = [np.arange(1, n) for n in (4, 6, 9, 3)]
    for key in ("input_ids", "attention_mask", "labels"):
        write(tmp_path / f"i_packed_{key}_document", seqs)
    ds = InstructionDataset({k: str(tmp_path / f"i_packed_{k}_document") for k in ("input_ids", "attention_mask",
                                                                                 "labels")},
                            seed=1, split="100,0,0", name="i")
    lengths = sorted(len(ds[i]["input_ids"]) for i in range(4))
    assert lengths == [2, 3, 5, 8]
    write(tmp_path / "j_packed_input_ids_document", seqs)
    write(tmp_path / "j_packed_attention_mask_document", seqs)
    write(tmp_path / "j_packed_labels_document", seqs[:3])
    with pytest.raises(DataError, match="disagree"):
        InstructionDataset({k: str(tmp_path / f"j_packed_{k}_document") for k in ("input_ids", "attention_mask",
                                                                                 "labels")},
                           seed=1, split="100,0,0", name="j")
