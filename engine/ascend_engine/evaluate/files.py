"""Reading benchmark files: csv rows and jsonl lines, each error naming the file and line."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from .questions import TaskDataError


def read_csv(path: Path, header: bool) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """The header (lower-cased; empty without one) and (first line, row) pairs. Every row must have as many
    fields as the header, or as the first row when there is none."""
    if not path.is_file():
        raise TaskDataError(f"{path}: missing file")
    names: list[str] = []
    rows: list[tuple[int, list[str]]] = []
    width = None
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        ended = 0
        for row in reader:
            line, ended = ended + 1, reader.line_num  # a quoted field may span lines: report where it starts
            if not row:
                continue
            if header and not names:
                names, width = [c.strip().lower() for c in row], len(row)
                continue
            width = width or len(row)
            if len(row) != width:
                raise TaskDataError(f"{path}:{line}: expected {width} columns, got {len(row)}")
            rows.append((line, row))
    return names, rows


def column(path: Path, names: list[str], wanted: str) -> int:
    if wanted not in names:
        raise TaskDataError(f"{path}:1: no '{wanted}' column (columns: {', '.join(names)})")
    return names.index(wanted)


def read_jsonl(path: Path, required: tuple[str, ...]) -> list[tuple[int, dict]]:
    """(line number, record) pairs; each non-blank line must be a JSON object with the ``required`` keys."""
    if not path.is_file():
        raise TaskDataError(f"{path}: missing file")
    out = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise TaskDataError(f"{path}:{line_no}: not valid JSON: {e.msg}") from None
            if not isinstance(record, dict):
                raise TaskDataError(f"{path}:{line_no}: expected a JSON object, got {type(record).__name__}")
            missing = [k for k in required if k not in record]
            if missing:
                raise TaskDataError(f"{path}:{line_no}: missing {', '.join(missing)}")
            out.append((line_no, record))
    return out


def data_files(path: Path, suffix: str) -> list[Path]:
    """``path`` itself when it is a file, else its ``*suffix`` files sorted by name."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise TaskDataError(f"{path}: no such file or directory")
    files = sorted(path.glob(f"*{suffix}"))
    if not files:
        raise TaskDataError(f"{path}: no *{suffix} files")
    return files
