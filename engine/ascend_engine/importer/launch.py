"""Find the training launch in a script's commands and split it into launcher options and training flags.

Recognised launchers: ``torchrun``, ``python -m torch.distributed.run|launch``, and a bare
``python pretrain_gpt.py`` (one process). The training entry point is the first ``*.py`` word after them
(``pretrain_gpt.py``, ``posttrain_gpt.py``) or a ``-m module``.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from .shell import Command, Script, ScriptError

_TORCH_MODULES = {"torch.distributed.run", "torch.distributed.launch"}


@dataclass
class Launch:
    launcher: dict[str, str]  # torchrun option (dashes, no leading --) -> value
    entry_point: str          # pretrain_gpt.py, posttrain_gpt.py, -m module
    flags: list[tuple[str, list[str]]]  # training flags in order, with the words that followed each
    line: int
    stray: list[str]          # words between entry point and the first flag (none in MindSpeed scripts)


def group_flags(words: list[str]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """``--a 1 2 --b --c x`` -> ([], [("--a", ["1", "2"]), ("--b", []), ("--c", ["x"])])."""
    leading: list[str] = []
    groups: list[tuple[str, list[str]]] = []
    for word in words:
        if word.startswith("--"):
            name, eq, value = word.partition("=")
            groups.append((name, [value] if eq else []))
        elif groups:
            groups[-1][1].append(word)
        else:
            leading.append(word)
    return leading, groups


def _is_python(word: str) -> bool:
    return os.path.basename(word).startswith("python")


def _launcher_end(words: list[str]) -> int | None:
    """Index of the word after the launcher program itself, or None when this is not a launch."""
    first = os.path.basename(words[0])
    if first == "torchrun":
        return 1
    if _is_python(words[0]):
        if len(words) > 2 and words[1] == "-m" and words[2] in _TORCH_MODULES:
            return 3
        if any(w.endswith(".py") for w in words[1:2]):
            return 1
    return None


def find_launch(script: Script, skip: Callable[[Command], bool] = lambda c: False) -> tuple[Launch, list[Command]]:
    """The first launch command, and the other launch commands (reported, not imported); ``skip``: commands
    that look like a launch but are not training (``python convert_ckpt.py``)."""
    launches = [c for c in script.commands if _launcher_end(c.words) is not None and not skip(c)]
    if not launches:
        raise ScriptError("no training launch found (torchrun, python -m torch.distributed.run, "
                          "or python pretrain_gpt.py)")
    command = launches[0]
    words = command.words
    i = _launcher_end(words)
    launcher: dict[str, str] = {}
    while i < len(words) and words[i].startswith("-") and words[i] != "-m":
        name, eq, value = words[i].lstrip("-").partition("=")
        i += 1
        if not eq:
            # All words up to the next option: an unquoted placeholder such as MASTER_ADDR="your master
            # node IP" splits into several, which bash would pass on the same way.
            taken = []
            while i < len(words) and not words[i].startswith("-") and not words[i].endswith(".py"):
                taken.append(words[i])
                i += 1
            value = " ".join(taken)
        launcher[name.replace("_", "-")] = value
    if i >= len(words):
        raise ScriptError(f"line {command.line}: the launch names no training script")
    if words[i] == "-m":
        entry, i = f"-m {words[i + 1]}" if i + 1 < len(words) else "-m", i + 2
    else:
        entry, i = words[i], i + 1
    stray, flags = group_flags(words[i:])
    return Launch(launcher, entry, flags, command.line, stray), launches[1:]
