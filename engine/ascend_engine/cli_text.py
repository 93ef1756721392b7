"""What our command lines print besides their results: help text without reStructuredText markup, a
did-you-mean for a misspelt flag, and a quiet end when the reader of stdout went away (``| head``)."""
from __future__ import annotations

import argparse
import difflib
import os
import re
import sys

_ROLE = re.compile(r":\w+:`([^`]*)`")  # :class:`Foo` -> Foo


def plain(text: str) -> str:
    """Docstring text as a terminal shows it: ``code`` and `code` lose their backticks, roles their names."""
    return _ROLE.sub(r"\1", text).replace("``", "").replace("`", "")


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return [s for action in parser._actions for s in action.option_strings]  # noqa: SLF001 (no public listing)


def unknown_flags_message(prog: str, parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    """``prog: error: unrecognized argument --x; did you mean --y?`` for each unknown flag (values skipped)."""
    known = option_strings(parser)
    lines = []
    for arg in unknown:
        if not arg.startswith("--"):
            continue
        flag = arg.split("=", 1)[0]
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.75)
        hint = f"; did you mean {close[0]}?" if close else ""
        lines.append(f"{prog}: error: unrecognized argument {flag}{hint}")
    if not lines:
        lines.append(f"{prog}: error: unrecognized arguments: {' '.join(unknown)}")
    return "\n".join(lines) + f"\n(`{prog} --help` lists the flags)"


def quiet_broken_pipe() -> int:
    """After a BrokenPipeError on stdout: no traceback, no second error at exit; the shell's SIGPIPE status."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 128 + 13  # 141, what a process killed by SIGPIPE reports
