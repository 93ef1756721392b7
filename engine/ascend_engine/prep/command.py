"""``ascend-engine preprocess``: MindSpeed-LLM's ``preprocess_data.py`` flags -> Megatron indexed datasets.

Records stream from the input in chunks, N worker processes tokenize them, results are written in input
order into temp files that are renamed only when the whole run succeeded; the manifest comes last.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import closing
from typing import Iterator, TextIO

from ..config.loader import add_flags, build_config
from ..config.prep import PrepConfig
from ..telemetry import Progress, report_result
from .encode import Chunk, ChunkProcessor, output_keys
from .indexed import IndexedDatasetWriter
from .readers import Source, describe, list_sources, read_source, total_bytes
from .report import ErrorLog, manifest_path, write_json_atomic
from .workers import process_chunks

_DESTS: dict[str, tuple[str, ...]] = {}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="PrepConfig YAML, or a whole DatasetPrep manifest (spec.prep)")
    _DESTS.update(add_flags(parser, PrepConfig))


def run(args: argparse.Namespace) -> int:
    cfg = build_config(PrepConfig, args, _DESTS, args.config, section="prep")
    return preprocess(cfg)


class InputStream:
    """Chunks of ``chunk_size`` records across all files, counting records and bytes as they pass."""

    def __init__(self, sources: list[Source], chunk_size: int):
        self.sources, self.chunk_size = sources, chunk_size
        self.records = [0] * len(sources)
        self.bytes_done = 0

    def _advance(self, n: int) -> None:
        self.bytes_done += n

    def chunks(self) -> Iterator[Chunk]:
        batch, index = [], 0
        for s, source in enumerate(self.sources):
            for line, payload in read_source(source, self._advance):
                self.records[s] += 1
                batch.append((s, line, payload))
                if len(batch) == self.chunk_size:
                    yield Chunk(index, batch)
                    batch, index = [], index + 1
        if batch:
            yield Chunk(index, batch)


def _human(n: float) -> str:
    for unit in ("", "K", "M", "G"):
        if abs(n) < 1000:
            return f"{n:.1f}{unit}" if unit else f"{n:.0f}"
        n /= 1000
    return f"{n:.1f}T"


def preprocess(cfg: PrepConfig, stream: TextIO | None = None) -> int:
    """Run one preprocessing job; 0 on success, 1 when bad records stopped it (nothing written)."""
    stream = stream or sys.stderr
    started = time.time()
    sources = list_sources(cfg.input)
    processor = ChunkProcessor(cfg)  # config problems (tokenizer, template, mapKeys) surface before any write
    inputs = InputStream(sources, cfg.chunkSize)
    size = total_bytes(sources)
    keys = output_keys(cfg)
    errors = ErrorLog(cfg.maxReportedErrors)
    truncations = ErrorLog(cfg.maxReportedErrors)
    stats = {"read": 0, "written": 0, "skipped": 0, "truncated": 0, "tokens": 0, "padding": 0}
    # Lines are printed here every logInterval records; Progress only keeps the figures (and the metrics).
    progress = Progress("preprocess", unit="records", interval_s=float("inf"), stream=stream)
    next_log = cfg.logInterval
    writers = {key: IndexedDatasetWriter(f"{cfg.outputPrefix}_{key}_document", processor.dtype) for key in keys}
    committed = False
    try:
        results = process_chunks(inputs.chunks(), processor, cfg.workers, cfg.workers * (1 + cfg.nSubs))
        with closing(results):
            for result in results:
                for s, line, message in result.errors:
                    errors.add(sources[s].where(line), message)
                for s, line, message in result.truncations:
                    truncations.add(sources[s].where(line), message)
                if result.errors and cfg.onError == "fail":
                    first = errors.lines()[0].strip()
                    report_result({"status": "Failed", "reason": "BadRecords",
                                   "message": f"{errors.count} bad record(s) (onError=fail), first {first}", "errors": {
                        "count": errors.count, "listed": errors.listed[:5]}})
                    stream.write("ascend-engine preprocess: bad records (onError=fail), no output written:\n"
                                 + "\n".join(errors.lines()) + "\n"
                                 "  (fix them, or pass --on-error skip to leave them out)\n")
                    return 1
                for key in keys:
                    writers[key].add(*result.arrays[key])
                for name in ("read", "written", "truncated", "tokens", "padding"):
                    stats[name] += getattr(result, name)
                stats["skipped"] += len(result.errors)
                if inputs.bytes_done:
                    progress.total = max(stats["read"], round(stats["read"] * size / inputs.bytes_done))
                progress.update(stats["read"] - progress.done)
                if stats["read"] >= next_log:
                    next_log = (stats["read"] // cfg.logInterval + 1) * cfg.logInterval
                    elapsed = max(progress.elapsed, 1e-9)
                    stream.write(progress.line(f"{_human(stats['tokens'] / elapsed)} tokens/s, "
                                               f"{inputs.bytes_done / elapsed / 1e6:.1f} MB/s") + "\n")
                    stream.flush()
        for writer in writers.values():
            writer.finish()
        manifest = manifest_path(cfg.outputPrefix)
        if os.path.exists(manifest):  # an old manifest must never describe the new files
            os.remove(manifest)
        outputs = [writer.commit() for writer in writers.values()]
        committed = True
    finally:
        if not committed:
            for writer in writers.values():
                writer.abort()
    elapsed = max(progress.elapsed, 1e-9)  # rates over the processing itself, not the tokenizer's loading
    write_json_atomic(manifest, {
        "status": "Succeeded",
        "handler": cfg.handlerName,
        "records": {k: stats[k] for k in ("read", "written", "skipped", "truncated")},
        "sequences": outputs[0]["sequences"] if outputs else 0,
        "tokens": stats["tokens"],
        "paddingTokens": stats["padding"],
        "dtype": processor.dtype.__name__,
        "vocabSize": len(processor.tokenizer),
        "bpe": processor.encode.bpe,
        "inputs": [{"path": s.path, "format": s.format, "bytes": s.size, "records": n}
                   for s, n in zip(sources, inputs.records)],
        "outputs": outputs,
        "errors": errors.as_dict(),
        "truncations": truncations.as_dict(),
        "elapsedSeconds": round(time.time() - started, 3),
        "workers": cfg.workers,
        "config": cfg.to_yaml_dict(),
    })
    report_result({"status": "Succeeded", "outputPrefix": cfg.outputPrefix, "manifest": manifest,
                   "datasets": [o["prefix"] for o in outputs], "dtype": processor.dtype.__name__,
                   "records": {k: stats[k] for k in ("read", "written", "skipped", "truncated")},
                   "sequences": outputs[0]["sequences"] if outputs else 0, "tokens": stats["tokens"]})
    if errors.count:
        stream.write(f"skipped {errors.count} bad record(s):\n" + "\n".join(errors.lines()) + "\n")
    if truncations.count:
        stream.write(f"truncated {truncations.count} of {stats['written']} sample(s) to seqLength "
                     f"{cfg.seqLength}:\n" + "\n".join(truncations.lines()) + "\n"
                     "  (--no-truncation makes an over-long sample an error: the run stops with no output, "
                     "or with --on-error skip it is left out)\n")
    progress.summary(
        f"{stats['read']} records from {describe(sources)} ({size / 1e6:.1f} MB), {stats['written']} written, "
        f"{stats['skipped']} skipped, {stats['truncated']} truncated; {_human(stats['tokens'])} tokens, "
        f"{_human(stats['read'] / elapsed)} records/s, {_human(stats['tokens'] / elapsed)} tokens/s, "
        f"{size / 1e6 / elapsed:.1f} MB/s -> {cfg.outputPrefix}_* ({manifest})")
    return 0
