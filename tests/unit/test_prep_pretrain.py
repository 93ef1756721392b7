"""Pretraining data: what megatron-core reads back is exactly what the tokenizer gives, in every input format."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
from prep_support import preprocess, read_dataset, tokenizer, tokenizer_dir, write_jsonl  # noqa: F401

TEXTS = ["The quick brown fox jumps over the lazy dog.", "你好，世界。", "Give three tips for staying healthy.",
         "a\nmulti-line\ndocument", "Megatron indexed datasets"]


def run(tmp_path: Path, tokenizer_dir: Path, input_path: Path, *extra: str) -> str:
    prefix = tmp_path / "out" / "corpus"
    assert preprocess("--input", input_path, "--tokenizer-name-or-path", tokenizer_dir, "--tokenizer-type",
                      "PretrainedFromHF", "--output-prefix", prefix, "--handler-name", "GeneralPretrainHandler",
                      *extra) == 0
    return str(prefix)


def test_tokens_match_direct_tokenization_and_megatron_builder(tmp_path, tokenizer_dir, tokenizer):
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = run(tmp_path, tokenizer_dir, write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in TEXTS]),
                 "--json-keys", "text", "--append-eod", "--workers", "1")
    expected = [tokenizer(t)["input_ids"] + [tokenizer.eos_token_id] for t in TEXTS]
    got = read_dataset(f"{prefix}_text_document")
    assert [g.tolist() for g in got] == expected
    assert got[0].dtype == np.uint16  # Megatron's choice for a vocabulary under 65500

    # Byte for byte what megatron-core's own builder writes for the same documents.
    ref = tmp_path / "ref"
    builder = IndexedDatasetBuilder(f"{ref}.bin", dtype=np.uint16)
    for doc in expected:
        builder.add_document(np.array(doc), [len(doc)])
    builder.finalize(f"{ref}.idx")
    for ext in ("bin", "idx"):
        assert Path(f"{prefix}_text_document.{ext}").read_bytes() == Path(f"{ref}.{ext}").read_bytes()

    manifest = json.loads(Path(f"{prefix}_manifest.json").read_text())
    assert manifest["records"] == {"read": 5, "written": 5, "skipped": 0, "truncated": 0}
    assert manifest["tokens"] == sum(map(len, expected))
    assert manifest["dtype"] == "uint16"
    assert manifest["inputs"] == [{"path": str(tmp_path / "c.jsonl"), "format": "jsonl",
                                   "bytes": (tmp_path / "c.jsonl").stat().st_size, "records": 5}]
    assert manifest["config"]["jsonKeys"] == ["text"] and manifest["config"]["appendEod"] is True
    assert not list((tmp_path / "out").glob("*.tmp-*"))


def test_several_json_keys_give_one_dataset_each(tmp_path, tokenizer_dir, tokenizer):
    records = [{"title": t[:5], "body": t} for t in TEXTS]
    prefix = run(tmp_path, tokenizer_dir, write_jsonl(tmp_path / "c.jsonl", records), "--json-keys", "title", "body")
    for key in ("title", "body"):
        assert [a.tolist() for a in read_dataset(f"{prefix}_{key}_document")] == \
            [tokenizer(r[key])["input_ids"] for r in records]


def _write_formats(directory: Path) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir()
    table = pa.table({"text": TEXTS, "id": list(range(len(TEXTS)))})
    paths = {"jsonl": write_jsonl(directory / "c.jsonl", [{"text": t} for t in TEXTS])}
    paths["json"] = directory / "c.json"
    paths["json"].write_text(json.dumps([{"text": t, "nested": {"a": [1, {"b": "]"}]}} for t in TEXTS], indent=1))
    paths["parquet"] = directory / "c.parquet"
    pq.write_table(table, paths["parquet"], row_group_size=2)
    paths["csv"] = directory / "c.csv"
    with open(paths["csv"], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["id", "text"])
        w.writeheader()
        w.writerows({"id": i, "text": t} for i, t in enumerate(TEXTS))
    paths["arrow"] = directory / "c.arrow"  # the IPC stream format HuggingFace datasets caches use
    with pa.OSFile(str(paths["arrow"]), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        for batch in table.to_batches(max_chunksize=2):
            w.write_batch(batch)
    paths["arrow-file"] = directory / "file" / "c.arrow"
    paths["arrow-file"].parent.mkdir()
    with pa.OSFile(str(paths["arrow-file"]), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table, max_chunksize=2)
    return paths


def test_every_input_format_gives_the_same_tokens(tmp_path, tokenizer_dir, tokenizer):
    expected = [tokenizer(t)["input_ids"] for t in TEXTS]
    for name, path in _write_formats(tmp_path / "in").items():
        prefix = run(tmp_path / name, tokenizer_dir, path)
        assert [a.tolist() for a in read_dataset(f"{prefix}_text_document")] == expected, name


def test_txt_lines_and_directories(tmp_path, tokenizer_dir, tokenizer, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "b.txt").write_text("second file line\n")
    (data / "a.txt").write_text("first line\n\nsecond line\n")
    prefix = run(tmp_path, tokenizer_dir, data)
    lines = ["first line", "second line", "second file line"]  # sorted by name, blank lines are not records
    assert [a.tolist() for a in read_dataset(f"{prefix}_text_document")] == [tokenizer(t)["input_ids"] for t in lines]
    (data / "c.jsonl").write_text("{}\n")
    assert preprocess("--input", data, "--tokenizer-name-or-path", tokenizer_dir, "--output-prefix",
                      tmp_path / "again") == 2
    assert "mixes formats (jsonl, txt)" in capsys.readouterr().err
