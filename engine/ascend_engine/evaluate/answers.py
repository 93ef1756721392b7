"""Each generative task's own answer extraction and check."""
from __future__ import annotations

import re

from .questions import TaskDataError

_NUMBER = re.compile(r"-?[\d,]*\.?\d+")


def _normalize_number(text: str) -> str | None:
    text = text.replace(",", "").replace("$", "").strip().rstrip(".")
    try:
        value = float(text)
    except ValueError:
        return None
    return str(int(value)) if value == int(value) else repr(value)


def gsm8k_reference(answer: str, where: str) -> str:
    """The number after '####' in a GSM8K answer."""
    if "####" not in answer:
        raise TaskDataError(f"{where}: GSM8K answer has no '#### <number>'")
    value = _normalize_number(answer.split("####")[-1])
    if value is None:
        raise TaskDataError(f"{where}: GSM8K answer after '####' is not a number: {answer.split('####')[-1]!r}")
    return value


def gsm8k_extract(generated: str) -> str | None:
    """The model's final number: after 'The answer is' or '####' when it says so, else the last number."""
    for cue in (r"[Tt]he answer is", "####"):
        parts = re.split(cue, generated)
        if len(parts) > 1:
            found = _NUMBER.findall(parts[-1])
            if found:
                return _normalize_number(found[0])
    found = _NUMBER.findall(generated)
    return _normalize_number(found[-1]) if found else None


def bbh_extract(generated: str) -> str:
    """The first line of the completion, stripped (BBH targets are short: '(A)', 'True', 'valid', ...)."""
    return generated.strip().split("\n")[0].strip().rstrip(".")


def agieval_cloze_extract(generated: str) -> str:
    """A cloze answer: the completion's first line, without ``$``, ``(`` and ``)`` (MindSpeed-LLM's reading)."""
    lines = generated.lstrip().splitlines()
    return (lines[0] if lines else "").replace("$", "").replace("(", "").replace(")", "").strip()


def cut_at_stop(text: str, stop: list[str]) -> str:
    """The text before the earliest stop sequence."""
    end = min((i for i in (text.find(s) for s in stop) if i >= 0), default=len(text))
    return text[:end]
