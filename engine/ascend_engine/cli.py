"""``ascend-engine <command>``: one console script, one module per command, imported only when used.

Each command module exposes ``add_arguments(parser)`` and ``run(args) -> int``; torch is imported by the
commands that need it, never by ``--help`` or by the config models.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import sys

from .cli_text import plain, unknown_flags_message

COMMANDS = {
    "train": ("ascend_engine.train.command", "pretrain / SFT / LoRA on Megatron-core (run under torchrun)"),
    "preprocess": ("ascend_engine.prep.command", "raw data -> Megatron indexed dataset (MindSpeed-LLM flags)"),
    "convert": ("ascend_engine.convert.command", "HF <-> Megatron-core checkpoints, resharding, LoRA merge"),
    "generate": ("ascend_engine.generate.command", "continue a prompt with a checkpoint (greedy / top-p), any TP/PP"),
    "evaluate": ("ascend_engine.evaluate.command", "benchmark accuracy (MMLU, CEval, GSM8K, HumanEval, ...), any TP/PP"),
    "wait-for-master": ("ascend_engine.rendezvous", "wait for the master's address and port, then exec a command"),
    "watch": ("ascend_engine.watch", "run your own trainer (torchrun ...) and serve its Megatron log lines as metrics"),
    "import-script": ("ascend_engine.importer.command", "MindSpeed-LLM launch script -> AscendTrainJob YAML"),
}


def main(argv: list[str] | None = None) -> int:
    """Run one command; without ``argv`` it is this process's own command line, and the process exits after it."""
    exiting = argv is None
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="ascend-engine", description=plain(__doc__.splitlines()[0]))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = argv[0] if argv and argv[0] in COMMANDS else None
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:  # only the chosen command's module is imported
            importlib.import_module(module).add_arguments(p)
            for action in p._actions:  # noqa: SLF001 - help taken from docstrings: no markup on a terminal
                action.help = plain(action.help) if action.help else action.help
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        print(unknown_flags_message(f"ascend-engine {args.command}", sub.choices[args.command], unknown),
              file=sys.stderr)
        return 2
    from .config.loader import ConfigError
    from .inplace import rank_by_pod
    from .stacks import install_stack_dump, watch_dump_requests
    from .telemetry import report_failure, serve_metrics_from_env

    rank_by_pod()  # before anything reads RANK: under the c10d rendezvous rank 0 stays in pod 0
    install_stack_dump()  # SIGUSR1: all threads' stacks to stderr, for diagnosing a hang
    watch_dump_requests()  # the same when the operator annotates the pod (stall detection)
    serve_metrics_from_env()  # one-pod jobs: the operator reads progress from here

    try:
        code = int(importlib.import_module(COMMANDS[args.command][0]).run(args) or 0)
        if exiting:  # the interpreter's exit then skips collecting torch's and Megatron's objects (~1.5 s)
            gc.freeze()
        return code
    except ConfigError as e:
        print(f"ascend-engine {args.command}: invalid config:\n{e}", file=sys.stderr)
        report_failure("InvalidConfig", str(e))
        return 2
    except Exception as e:  # the cause reaches the job's status, then the traceback the log as usual
        report_failure(type(e).__name__, f"{type(e).__name__}: {e}")
        raise


if __name__ == "__main__":
    sys.exit(main())
