"""`ascend-engine evaluate --task humaneval --completions samples.jsonl`: supplied completions scored in the
sandbox, pass@k by the Codex paper's unbiased estimator, bad samples named by file and line."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ascend_engine.evaluate.completions import pass_at_k
from ascend_engine.evaluate.sandbox import detect_isolation

PROBLEMS = [
    {"task_id": "T/0", "prompt": "def add(a, b):\n", "entry_point": "add",
     "test": "def check(f):\n    assert f(2, 3) == 5\n"},
    {"task_id": "T/1", "prompt": "def neg(a):\n", "entry_point": "neg",
     "test": "def check(f):\n    assert f(4) == -4\n"},
]


def test_pass_at_k_matches_a_hand_computation():
    # n=5 samples, c=2 correct: pass@1 = 2/5; pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10; pass@3 = 1 - C(3,3)/C(5,3)
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)
    assert pass_at_k(5, 2, 4) == 1.0 and pass_at_k(5, 0, 5) == 0.0
    # the paper's numerically stable form, 1 - prod(1 - k / i) for i in n-c+1..n, at n=200
    stable = 1.0
    for i in range(200 - 37 + 1, 201):
        stable *= 1 - 10 / i
    assert pass_at_k(200, 37, 10) == pytest.approx(1 - stable, rel=1e-12)
    with pytest.raises(ValueError, match="pass@10 needs at least 10 samples"):
        pass_at_k(5, 1, 10)


def _evaluate(tmp_path, samples, *flags):
    problems, completions = tmp_path / "problems.jsonl", tmp_path / "samples.jsonl"
    problems.write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS))
    completions.write_text("".join(json.dumps(s) + "\n" for s in samples))
    cmd = [sys.executable, "-m", "ascend_engine.cli", "evaluate", "--task", "humaneval", "--task-data-path",
           str(problems), "--completions", str(completions), "--code-timeout", "3", *flags]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ})


@pytest.mark.skipif(detect_isolation().name == "none", reason="no sandbox here (the refusal: test_sandbox.py)")
def test_supplied_completions_get_pass_at_k_and_say_which_sandbox_ran(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    os.chmod(outside, 0o777)
    samples = [{"task_id": "T/0", "completion": "    return a + b\n"},
               {"task_id": "T/0", "completion": "    return a - b\n"},
               {"task_id": "T/0", "completion": "    return b + a\n"},
               {"task_id": "T/1", "completion": "    return -a\n"},
               {"task_id": "T/1", "completion": f"    import os\n    os.chdir({str(outside)!r})\n"
                                                f"    open('owned', 'w')\n    return -a\n"},
               {"task_id": "T/1", "completion": "    import os, signal\n    os.kill(os.getppid(), signal.SIGKILL)\n"
                                                "    return -a\n"}]
    out = _evaluate(tmp_path, samples, "--results-path", str(tmp_path / "results.json"))
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "results.json").read_text())
    [result] = report["results"]
    # T/0: 2 of 3 correct; T/1: 2 of 3 (the write outside fails, killing the parent reaches nothing)
    assert result["passAtK"] == {"1": pytest.approx(2 / 3)} and result["samplesPerTask"] == 3
    assert [p["correct"] for p in result["predictions"]] == [True, False, True, True, False, True]
    assert report["sandbox"].startswith(("bubblewrap", "landlock")) and result["sandbox"] == report["sandbox"]
    assert f"under {report['sandbox']}" in out.stderr and "pass@1=0.6667" in out.stdout
    assert os.listdir(outside) == []


def test_bad_samples_are_named_by_file_and_line(tmp_path):
    out = _evaluate(tmp_path, [{"task_id": "T/0", "completion": "    return a + b\n"},
                               {"task_id": "T/9", "completion": "x"}])
    assert out.returncode == 2
    assert f"{tmp_path / 'samples.jsonl'}:2: task_id 'T/9' is not a problem of the task data" in out.stderr
    assert not (tmp_path / "evaluation_results.json").exists()


def test_generation_still_needs_a_tokenizer():
    from pydantic import ValidationError

    from ascend_engine.config.evaluate import EvaluateConfig

    with pytest.raises(ValidationError, match="tokenizerNameOrPath is required"):
        EvaluateConfig(task=["humaneval"], taskDataPath=["x"], load="c")
    with pytest.raises(ValidationError, match="needs task \\[humaneval\\] alone"):
        EvaluateConfig(task=["gsm8k"], taskDataPath=["x"], completions="s.jsonl")
