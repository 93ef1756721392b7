"""Streaming readers: records come out one at a time with their file and line, never a whole file in memory.

A record is ``(line, payload)``: ``line`` is the 1-based line (text formats) or row (parquet, arrow);
``payload`` is a dict, or for JSON lines the raw bytes, so that parsing happens in the worker processes.
"""
from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from ..config.loader import ConfigError

FORMATS = {".jsonl": "jsonl", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "txt",
           ".arrow": "arrow"}
COLUMNAR = ("parquet", "arrow")
JSON_ARRAY_READ = 1 << 20
JSON_ARRAY_MAX_RECORD = 64 << 20


class InputError(ConfigError):
    """An input that cannot be read at all (as opposed to one bad record in it)."""


@dataclass
class Source:
    path: str
    format: str
    size: int

    def where(self, line: int) -> str:
        return f"{self.path}: row {line}" if self.format in COLUMNAR else f"{self.path}:{line}"


def list_sources(input_path: str) -> list[Source]:
    """One file, or every supported file directly in a directory (sorted by name, one format only)."""
    path = Path(input_path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in FORMATS)
        if not files:
            raise InputError(f"input: {path} holds no {', '.join(sorted(FORMATS))} files")
        formats = {FORMATS[p.suffix.lower()] for p in files}
        if len(formats) > 1:
            raise InputError(f"input: {path} mixes formats ({', '.join(sorted(formats))}); "
                             "a directory must hold one format")
    elif path.is_file():
        if path.suffix.lower() not in FORMATS:
            raise InputError(f"input: {path}: unsupported format {path.suffix!r}; use one of "
                             f"{', '.join(sorted(FORMATS))}")
        files = [path]
    else:
        raise InputError(f"input: {path} does not exist")
    return [Source(str(p), FORMATS[p.suffix.lower()], p.stat().st_size) for p in files]


def read_source(source: Source, on_bytes: Callable[[int], None]) -> Iterator[tuple[int, Any]]:
    """Records of one file; ``on_bytes(n)`` is told how many more bytes of the file are behind us."""
    reader = {"jsonl": _jsonl, "json": _json, "csv": _csv, "txt": _txt, "parquet": _parquet,
              "arrow": _arrow}[source.format]
    yield from reader(source, on_bytes)


def _jsonl(source: Source, on_bytes) -> Iterator[tuple[int, Any]]:
    with open(source.path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            on_bytes(len(raw))
            if raw.strip():
                yield number, raw


def _json(source: Source, on_bytes) -> Iterator[tuple[int, Any]]:
    """A JSON array streamed element by element; a file that is not an array is read as JSON lines."""
    with open(source.path, "rb") as f:
        head = f.read(4096).lstrip()
    if not head.startswith(b"["):
        yield from _jsonl(source, on_bytes)
        return
    decoder = json.JSONDecoder()
    with open(source.path, encoding="utf-8") as f:
        buf = f.read(JSON_ARRAY_READ)
        on_bytes(len(buf))
        pos = buf.index("[") + 1
        line = 1 + buf.count("\n", 0, pos)
        eof = False
        while True:
            while True:  # skip separators, refilling the buffer as needed
                while pos < len(buf) and buf[pos] in " \t\r\n,":
                    if buf[pos] == "\n":
                        line += 1
                    pos += 1
                if pos < len(buf) or eof:
                    break
                buf, pos = f.read(JSON_ARRAY_READ), 0
                on_bytes(len(buf))
                eof = not buf
            if pos >= len(buf):
                raise InputError(f"{source.path}:{line}: JSON array is not closed with ']'")
            if buf[pos] == "]":
                return
            try:
                value, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError as e:
                more = "" if eof else f.read(JSON_ARRAY_READ)
                if more and len(buf) - pos < JSON_ARRAY_MAX_RECORD:
                    on_bytes(len(more))
                    buf, pos = buf[pos:] + more, 0
                    continue
                # Inside an array there is no next line to resume from: the whole file is unreadable.
                raise InputError(f"{source.path}:{line + buf.count(chr(10), pos, e.pos)}: malformed JSON "
                                 f"in array: {e.msg}") from None
            yield line, value
            line += buf.count("\n", pos, end)
            pos = end


def _csv(source: Source, on_bytes) -> Iterator[tuple[int, Any]]:
    with open(source.path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        done, start = 0, 2  # line 1 is the header
        for row in reader:
            position = f.buffer.tell()
            on_bytes(position - done)
            done = position
            yield start, dict(row)
            start = reader.line_num + 1


def _txt(source: Source, on_bytes) -> Iterator[tuple[int, Any]]:
    """One record per non-blank line, as the column ``text`` (HuggingFace's text loader)."""
    with open(source.path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            on_bytes(len(raw))
            text = raw.decode("utf-8").rstrip("\r\n")
            if text.strip():
                yield number, {"text": text}


def _batches_as_rows(batches, position: Callable[[], int], on_bytes) -> Iterator[tuple[int, Any]]:
    """Rows of record batches; ``position()`` says how far into the file the batches read so far reach."""
    row, done = 0, 0
    for batch in batches:
        for record in batch.to_pylist():
            row += 1
            yield row, record
        now = position()
        on_bytes(now - done)
        done = now


def _parquet(source: Source, on_bytes) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(source.path)
    except Exception as e:  # pyarrow raises its own error types for bad files
        raise InputError(f"{source.path}: cannot read parquet: {e}") from None
    rows = max(pf.metadata.num_rows, 1)
    seen = [0]

    def counted(batches):
        for batch in batches:
            seen[0] += batch.num_rows
            yield batch

    yield from _batches_as_rows(counted(pf.iter_batches(batch_size=1024)),
                                lambda: source.size * seen[0] // rows, on_bytes)


def _arrow(source: Source, on_bytes) -> Iterator[tuple[int, Any]]:
    """Arrow IPC: the file format, or the stream format that HuggingFace ``datasets`` caches use."""
    import pyarrow as pa

    with pa.memory_map(source.path) as mm:
        try:
            reader = pa.ipc.open_file(mm)
        except pa.ArrowInvalid:
            mm.seek(0)
            try:
                stream = pa.ipc.open_stream(mm)
            except pa.ArrowInvalid as e:
                raise InputError(f"{source.path}: not an Arrow IPC file or stream: {e}") from None
            yield from _batches_as_rows(stream, mm.tell, on_bytes)
            return
        n = max(reader.num_record_batches, 1)
        index = [0]

        def batches():
            for index[0] in range(reader.num_record_batches):
                yield reader.get_batch(index[0])

        yield from _batches_as_rows(batches(), lambda: source.size * (index[0] + 1) // n, on_bytes)


def total_bytes(sources: list[Source]) -> int:
    return sum(s.size for s in sources)


def describe(sources: list[Source]) -> str:
    return (sources[0].path if len(sources) == 1
            else f"{len(sources)} files in {os.path.dirname(sources[0].path)}")
