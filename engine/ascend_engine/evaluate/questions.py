"""What every task reader produces: questions scored by likelihood, or answered by generation."""
from __future__ import annotations

from dataclasses import dataclass, field


class TaskDataError(ValueError):
    """A benchmark file that cannot be read; the message names the file (and line)."""


@dataclass
class ChoiceQuestion:
    """Scored by the log-likelihood of each option after ``context``; the most likely option is the prediction."""

    id: str
    subject: str
    context: str
    options: list[str]
    gold: int


@dataclass
class OpenQuestion:
    """Answered by greedy generation after ``prompt``; ``reference`` is what the task's checker compares with
    (a number for GSM8K, a target string for BBH, the test program for HumanEval)."""

    id: str
    subject: str
    prompt: str
    reference: str
    stop: list[str] = field(default_factory=list)
    entry_point: str = ""
