"""Bad input: each case named by file and line; fail writes nothing, skip counts; earlier output survives."""
from __future__ import annotations

import json
from pathlib import Path

from prep_support import preprocess, read_dataset, tokenizer_dir, write_jsonl  # noqa: F401

GOOD = {"instruction": "hi", "output": "hello"}
BAD = [
    GOOD,
    '{"instruction": "broken", "output": ',
    {"question": "no mapped keys", "output": "x"},
    {"instruction": "empty reply", "output": "  "},
    GOOD,
    {"instruction": "The quick brown fox jumps over the lazy dog. " * 10, "output": "ok"},
]
MESSAGES = ["bad.jsonl:2: malformed JSON", "bad.jsonl:3: missing field 'instruction' (mapKeys.prompt)",
            "bad.jsonl:4: empty response in field 'output' (mapKeys.response)",
            "bad.jsonl:6: sample has"]


def run(tmp_path: Path, tokenizer_dir, *extra: str) -> int:
    return preprocess("--input", write_jsonl(tmp_path / "bad.jsonl", BAD), "--tokenizer-name-or-path", tokenizer_dir,
                      "--output-prefix", tmp_path / "out" / "sft", "--handler-name", "AlpacaStyleInstructionHandler",
                      "--prompt-type", "chatml", "--seq-length", "32", "--no-truncation", "--chunk-size", "2",
                      *extra)


def test_fail_names_file_and_line_and_writes_nothing(tmp_path, tokenizer_dir, capsys):
    assert run(tmp_path, tokenizer_dir) == 1
    err = capsys.readouterr().err
    assert "bad.jsonl:2: malformed JSON" in err and "--on-error skip" in err
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_skip_lists_every_case_and_counts_them(tmp_path, tokenizer_dir, capsys):
    assert run(tmp_path, tokenizer_dir, "--on-error", "skip", "--max-reported-errors", "3") == 0
    err = capsys.readouterr().err
    for message in MESSAGES[:3]:
        assert message in err
    assert "... and 1 more" in err
    manifest = json.loads((tmp_path / "out" / "sft_manifest.json").read_text())
    assert manifest["records"] == {"read": 6, "written": 2, "skipped": 4, "truncated": 0}
    assert manifest["errors"]["count"] == 4
    listed = [f"{Path(e['where']).name}: {e['message']}" for e in manifest["errors"]["listed"]]
    assert len(listed) == 3 and all(got.startswith(want) for got, want in zip(listed, MESSAGES))
    assert len(read_dataset(str(tmp_path / "out" / "sft_packed_input_ids_document"))) == 2

    assert run(tmp_path, tokenizer_dir, "--on-error", "skip") == 0
    listed = json.loads((tmp_path / "out" / "sft_manifest.json").read_text())["errors"]["listed"]
    assert any(e["where"].endswith("bad.jsonl:6") and "longer than seqLength 32" in e["message"] for e in listed)


def test_a_failed_run_leaves_the_previous_output_alone(tmp_path, tokenizer_dir):
    assert run(tmp_path, tokenizer_dir, "--on-error", "skip") == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    assert run(tmp_path, tokenizer_dir) == 1
    after = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    assert after == before  # no temp files left, nothing replaced


def test_unreadable_inputs_and_bad_config(tmp_path, tokenizer_dir, capsys):
    array = tmp_path / "broken.json"
    array.write_text('[\n {"text": "ok"},\n {"text": oops}\n]\n')
    args = ("--tokenizer-name-or-path", tokenizer_dir, "--output-prefix", tmp_path / "x")
    assert preprocess("--input", array, *args) == 2
    assert f"{array}:3: malformed JSON in array" in capsys.readouterr().err
    assert preprocess("--input", tmp_path / "missing.jsonl", *args) == 2
    assert "does not exist" in capsys.readouterr().err
    good = write_jsonl(tmp_path / "good.jsonl", [GOOD])
    assert preprocess("--input", good, *args, "--handler-name", "AlpacaStyleInstructionHandler",
                      "--prompt-type", "chatml", "--map-keys", '{"prompt": "q",') == 2
    assert "mapKeys: not valid JSON" in capsys.readouterr().err
    assert preprocess("--input", good, *args, "--handler-name", "AlpacaStyleInstructionHandler",
                      "--prompt-type", "chatml", "--map-keys", '{"answer": "a"}') == 2
    assert "mapKeys: unknown key 'answer'" in capsys.readouterr().err
    assert preprocess("--input", good, *args, "--handler-name", "AlpacaStyleInstructionHandler") == 2
    assert "promptType is required" in capsys.readouterr().err
    assert not list(tmp_path.glob("x*"))
