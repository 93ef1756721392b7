"""``ascend-engine watch -- torchrun pretrain_gpt.py ...``: run a trainer that is not ours and publish its progress.

The command's output passes through unchanged (stdout to stdout, stderr to stderr, line by line); Megatron-LM /
MindSpeed-LLM log lines in it (``megatron_log``) become the engine's metrics, served where ``ASCEND_METRICS_PORT``
says (the operator sets it), so a bring-your-own job has the same status.progress, columns, dashboard curves and
Prometheus series as an engine job without any change to the training code.

Signals the wrapper gets (SIGTERM from the kubelet, SIGINT, SIGHUP, SIGUSR1/2) are passed to the command, and the
wrapper exits with the command's exit code (128 + N when a signal N ended it). On success the last figures become
the termination message (the operator's final progress); on failure the command's own last exception line does
(the job's Failed cause), found in its whole output rather than in the log tail Kubernetes would keep.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from typing import IO

from .exception_line import exception_line, worker_exit_code
from .megatron_log import MegatronLogReader, seq_length_from_argv
from .telemetry import METRICS_PORT_ENV, report_failure, report_result, serving

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=["megatron"], default="megatron",
                        help="log format to read (Megatron-LM / MindSpeed-LLM iteration lines)")
    parser.add_argument("then", nargs=argparse.REMAINDER, metavar="COMMAND", help="-- then the trainer's command")


class Watcher:
    def __init__(self, reader: MegatronLogReader):
        self.reader = reader
        self.cause: str | None = None
        self.tail: list[str] = []  # torchrun's failure summary (its workers' exit codes) is at the end
        self._lock = threading.Lock()

    def pump(self, source: IO[bytes], sink: IO[str]) -> None:
        for raw in iter(source.readline, b""):
            line = raw.decode(errors="replace")
            sink.write(line)
            sink.flush()
            with self._lock:
                if self.reader.feed(line) and (metrics := serving()) is not None:
                    metrics.set(**self.reader.figures)
                if cause := exception_line(line):
                    self.cause = cause
                self.tail = [*self.tail[-79:], line]


def run(args: argparse.Namespace) -> int:
    command = args.then[1:] if args.then[:1] == ["--"] else args.then
    if not command:
        print("ascend-engine watch: no command given after --", file=sys.stderr)
        return 2
    # The metrics endpoint is this wrapper's (cli.main served it from ASCEND_METRICS_PORT); a trainer that serves
    # the contract itself (e.g. the Transformers callback) must not try the same port.
    env = {k: v for k, v in os.environ.items() if k != METRICS_PORT_ENV}
    try:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    except OSError as e:
        report_failure("TrainerNotStarted", f"{command[0]}: {e.strerror or e}")
        print(f"ascend-engine watch: cannot start {command[0]}: {e}", file=sys.stderr)
        return 127 if isinstance(e, FileNotFoundError) else 126
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, _frame: child.poll() is None and child.send_signal(signum))
    watcher = Watcher(MegatronLogReader(seq_length=seq_length_from_argv(command)))
    pumps = [threading.Thread(target=watcher.pump, args=(child.stdout, sys.stdout), daemon=True),
             threading.Thread(target=watcher.pump, args=(child.stderr, sys.stderr), daemon=True)]
    for t in pumps:
        t.start()
    code = child.wait()
    for t in pumps:
        t.join()
    code = 128 - code if code < 0 else code
    if code == 0:
        report_result(dict(watcher.reader.figures))
    else:
        worker = worker_exit_code("".join(watcher.tail))  # Megatron's rerun exit codes 16 / 17 under torchrun
        report_failure("TrainerFailed", watcher.cause or f"{command[0]} exited with code {code}",
                       {"workerExitCode": worker} if worker is not None else None)
    return code
