"""Rule rewards: answer extraction, normalisation, the R1 format, and reward functions loaded by module path."""
from __future__ import annotations

import sys

import pytest

from ascend_engine.rl.rewards import (RewardFunctionError, exact_match_reward, extract_answer, format_reward,
                                      last_boxed, load_reward_function, math_reward, normalize_answer, score)


@pytest.mark.parametrize("text, boxed", [
    ("so \\boxed{42}.", "42"),
    ("first \\boxed{1} then \\boxed{2}", "2"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\fbox{7}", "7"),
    ("no box here 5", None),
    ("cut off \\boxed{3", None),
])
def test_last_boxed(text, boxed):
    assert last_boxed(text) == boxed


@pytest.mark.parametrize("text, answer", [
    ("<think>2+2</think><answer>4</answer>", "4"),
    ("I think it is 12 or maybe 13", "13"),
    ("Natalia sold 48/2 = 24 clips.\n#### 72", " 72"),
    ("the box wins over tags \\boxed{9} <answer>8</answer>", "9"),
    ("total: 1,000 apples", "1,000"),
    ("negative -3.5 degrees", "-3.5"),
    ("nothing numeric", None),
    ("so 3/2", "3/2"),  # a fraction is one value, not its denominator
    ("half is \\frac{1}{2} here", "\\frac{1}{2}"),
    ("it is -\\dfrac34", "-\\dfrac34"),
    ("48/2 = 24", "24"),
])
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


@pytest.mark.parametrize("a, b", [
    ("1,000", "1000"), ("3.0", "3"), ("0.5", "1/2"), ("\\frac{1}{2}", "0.5"), ("\\dfrac{3}{4}", "0.75"),
    ("$5", "5"), ("\\$5", "5.00"), (" 72 ", "72"), ("-2", "-2.0"), ("12,345,678", "12345678"), ("x + 1", "x+1"),
    ("Paris.", "paris"),
])
def test_normalisation_equates(a, b):
    assert normalize_answer(a) == normalize_answer(b)


@pytest.mark.parametrize("a, b", [("1,00", "100"), ("3.01", "3"), ("1/3", "0.33"), ("-2", "2"), ("x+1", "x+2")])
def test_normalisation_distinguishes(a, b):
    assert normalize_answer(a) != normalize_answer(b)


@pytest.mark.parametrize("response, reference, reward", [
    ("<think>48/2=24, 48+24=72</think><answer>\\boxed{72}</answer>", "#### 72", 1.0),
    ("The answer is 72.", "Natalia sold 24 clips in May. 48+24 = 72\n#### 72", 1.0),
    ("The answer is 71.", "#### 72", 0.0),
    ("\\boxed{1000}", "1,000", 1.0),
    ("so \\boxed{3.0}", "\\boxed{3}", 1.0),
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("no answer at all", "5", 0.0),
    ("\\boxed{5}", None, 0.0),
    ("12 apples, 3 pears", "12", 0.0),  # the last number is 3
    # fractions outside a box, a tag or ####: compared by value, never by their last number
    ("so 3/2", "1/2", 0.0),
    ("so 3/2", "#### 2", 0.0),
    ("1/2", "0.5", 1.0),
    ("\\frac{1}{2}", "0.5", 1.0),
    ("it is -\\frac{1}{2}", "-0.5", 1.0),
    ("x = 1.5 / 3", "\\boxed{\\frac12}", 1.0),
    ("<answer>1/2</answer>", "\\tfrac{1}{2}", 1.0),
    ("#### 3/4", "0.75", 1.0),
])
def test_math_reward(response, reference, reward):
    assert math_reward(response, reference) == reward


@pytest.mark.parametrize("response, reward", [
    ("<think>a</think><answer>b</answer>", 1.0),
    ("  <think>\nline 1\nline 2\n</think>\n<answer>42</answer>\n", 1.0),
    ("<answer>b</answer>", 0.0),
    ("<think>a</think>", 0.0),
    ("<think>a</think><answer>b</answer> trailing text", 0.0),
    ("preamble <think>a</think><answer>b</answer>", 0.0),
    ("<answer>b</answer><think>a</think>", 0.0),
    ("<think>a<answer>b</answer>", 0.0),
])
def test_format_reward(response, reward):
    assert format_reward(response) == reward


def test_exact_match_ignores_only_whitespace():
    assert exact_match_reward("  hello   world\n", "hello world") == 1.0
    assert exact_match_reward("Hello world", "hello world") == 0.0
    assert exact_match_reward("anything", None) == 0.0


def test_builtin_rules_by_name_and_weighted_score():
    assert load_reward_function("math") is math_reward
    rewards = score(["<think>x</think><answer>\\boxed{4}</answer>", "<answer>4</answer>", "5"], ["4", "4", "4"],
                    {"math": 1.0, "format": 0.5})
    assert rewards == [1.5, 1.0, 0.0]
    with pytest.raises(ValueError, match="2 responses but 1 references"):
        score(["a", "b"], ["a"], {"math": 1.0})


def test_reward_function_loaded_by_module_path(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def length_penalty(response, reference):\n    return -len(response) / 10\n"
        "class Scorer:\n    @staticmethod\n    def first_word(response, reference):\n"
        "        return float(response.split()[0] == reference)\n"
        "NOT_A_FUNCTION = 3\n")
    (tmp_path / "broken_rewards.py").write_text("import does_not_exist_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_reward_function("my_rewards:length_penalty")("abcde", None) == -0.5
    assert load_reward_function("my_rewards:Scorer.first_word")("yes sir", "yes") == 1.0
    assert score(["abc"], [None], {"my_rewards:length_penalty": 2.0}) == [pytest.approx(-0.6)]
    with pytest.raises(RewardFunctionError, match=r"'no_such_module_xyz:f'.*cannot import module 'no_such_module_xyz'"):
        load_reward_function("no_such_module_xyz:f")
    with pytest.raises(RewardFunctionError, match=r"cannot import module 'broken_rewards'.*does_not_exist_anywhere"):
        load_reward_function("broken_rewards:f")
    with pytest.raises(RewardFunctionError, match=r"has no attribute 'missing'"):
        load_reward_function("my_rewards:missing")
    with pytest.raises(RewardFunctionError, match=r"'NOT_A_FUNCTION' is a int, not a function"):
        load_reward_function("my_rewards:NOT_A_FUNCTION")
    with pytest.raises(RewardFunctionError, match=r"expected one of \['exact_match', 'format', 'math'\]"):
        load_reward_function("mathematics")
    sys.modules.pop("my_rewards", None)
