"""Rule rewards for verifiable tasks: math answers, exact match, the R1 output format, and user functions.

A reward function takes ``(response, reference)`` (the generated text and the dataset's reference answer, which
may be None) and returns a float. The built-in ones are named in ``RULES``; any other is referenced as
``"package.module:function"`` and loaded with ``load_reward_function``.

Math answers: the answer of a text is its last ``\\boxed{...}`` (nested braces allowed), else the content of its
last ``<answer>...</answer>``, else its last number, where a fraction (``3/2``, ``\\frac{3}{2}``, ``\\dfrac34``) counts
as one number and no number is lifted out of it; GSM8K references (``... #### 72``) give the number after
``####``. Two answers match when they are the same number (``1,000`` = ``1000``, ``3.0`` = ``3``, ``1/2`` =
``\\frac{1}{2}`` = ``0.5``, ``$5`` = ``5``) or, when either is not a number, the same text once spaces, ``$``
and a trailing full stop are dropped.
"""
from __future__ import annotations

import importlib
import re
from fractions import Fraction
from typing import Callable

RewardFunction = Callable[[str, "str | None"], float]

_PLAIN_NUMBER = r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+"
# The last value of a text: a LaTeX fraction, a plain fraction, or a number, tried in that order at each place,
# so "3/2" and "\frac{1}{2}" are one value each rather than their last number.
_VALUE = re.compile(r"-?\\[dt]?frac\s*(?:\{[^{}]*\}\s*\{[^{}]*\}|\d\s*\d)"
                    rf"|(?:{_PLAIN_NUMBER})\s*/\s*(?:{_PLAIN_NUMBER})"
                    rf"|{_PLAIN_NUMBER}")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_FORMAT = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)
_FRAC = re.compile(r"^(-?)\\[dt]?frac(?:\{(-?[\d.]+)\}\{(-?[\d.]+)\}|(\d)(\d))$")
_SLASH = re.compile(r"^(-?(?:\d+(?:\.\d*)?|\.\d+))/(-?(?:\d+(?:\.\d*)?|\.\d+))$")
_THOUSANDS = re.compile(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; None when there is none."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None  # unbalanced: the model stopped inside the box


def last_number(text: str) -> str | None:
    """The last value written in ``text``: a number (thousands separators kept, for ``normalize_answer``) or a
    whole fraction (``3/2``, ``\\frac{3}{2}``), never the denominator alone."""
    found = _VALUE.findall(text)
    return found[-1].rstrip(",") if found else None


def extract_answer(text: str) -> str | None:
    """The final answer of a response or a reference: boxed, else tagged, else after ``####``, else last number."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    tagged = _ANSWER_TAG.findall(text)
    if tagged:
        return tagged[-1]
    if "####" in text:
        return text.rsplit("####", 1)[1]
    return last_number(text)


def _as_number(text: str) -> Fraction | None:
    s = text.replace(" ", "").replace("$", "").rstrip(".")
    if s.startswith("\\$"):
        s = s[2:]
    frac = _FRAC.match(s)
    try:
        if frac:
            value = Fraction(frac[2] or frac[4]) / Fraction(frac[3] or frac[5])
            return -value if frac[1] else value
        if "," in s:
            if not _THOUSANDS.match(s):
                return None
            s = s.replace(",", "")
        slash = _SLASH.match(s)
        if slash:
            return Fraction(slash[1]) / Fraction(slash[2])
        if re.fullmatch(r"-?(\d+(\.\d*)?|\.\d+)", s):
            return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def normalize_answer(text: str) -> str:
    """A canonical form: a number as a reduced fraction (``3.0`` -> ``3``, ``0.5`` -> ``1/2``), else plain text."""
    number = _as_number(text.strip())
    if number is not None:
        return str(number)
    return re.sub(r"\s+", "", text).replace("\\$", "").replace("$", "").rstrip(".").lower()


def answers_match(response_answer: str | None, reference_answer: str | None) -> bool:
    if response_answer is None or reference_answer is None:
        return False
    return normalize_answer(response_answer) == normalize_answer(reference_answer)


def math_reward(response: str, reference: str | None) -> float:
    """1.0 when the response's final answer equals the reference's, else 0.0."""
    if reference is None:
        return 0.0
    ref = extract_answer(reference)
    return 1.0 if answers_match(extract_answer(response), ref if ref is not None else reference) else 0.0


def exact_match_reward(response: str, reference: str | None) -> float:
    """1.0 when the whole response equals the reference, ignoring surrounding and repeated whitespace."""
    if reference is None:
        return 0.0
    return 1.0 if " ".join(response.split()) == " ".join(reference.split()) else 0.0


def format_reward(response: str, reference: str | None = None) -> float:
    """1.0 for exactly ``<think>...</think><answer>...</answer>`` (whitespace around allowed), else 0.0."""
    return 1.0 if _FORMAT.match(response) else 0.0


RULES: dict[str, RewardFunction] = {"math": math_reward, "exact_match": exact_match_reward,
                                    "format": format_reward}


class RewardFunctionError(ValueError):
    """A reward named in the configuration cannot be used; the message says which and why."""


def load_reward_function(spec: str) -> RewardFunction:
    """A built-in rule by name (``math``, ``exact_match``, ``format``) or ``"package.module:function"``."""
    if spec in RULES:
        return RULES[spec]
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise RewardFunctionError(f"reward {spec!r}: expected one of {sorted(RULES)} or 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any import failure (missing module, error inside it) is reported
        raise RewardFunctionError(f"reward {spec!r}: cannot import module {module_name!r}: "
                                  f"{type(e).__name__}: {e}") from e
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise RewardFunctionError(f"reward {spec!r}: module {module_name!r} ({module.__file__}) has no "
                                      f"attribute {attr!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise RewardFunctionError(f"reward {spec!r}: {attr!r} is a {type(fn).__name__}, not a function")
    return fn


def score(responses: list[str], references: list[str | None], rewards: dict[str, float]) -> list[float]:
    """Weighted sum of the named rewards (``{"math": 1.0, "format": 0.1}``) for every response."""
    if len(responses) != len(references):
        raise ValueError(f"{len(responses)} responses but {len(references)} references")
    fns = {spec: load_reward_function(spec) for spec in rewards}
    return [sum(w * float(fns[spec](r, ref)) for spec, w in rewards.items()) for r, ref in zip(responses, references)]
