"""``ascend-engine evaluate --task humaneval --completions samples.jsonl``: score code produced elsewhere (OpenAI
human-eval's sample format, ``{"task_id", "completion"}`` per line, ``n`` samples per task) in the same sandbox,
and report pass@k with the unbiased estimator of the Codex paper (Chen et al. 2021, eq. 1)."""
from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from math import comb
from pathlib import Path

from ..config.evaluate import EvaluateConfig
from .files import read_jsonl
from .questions import TaskDataError
from .scoring import Outcome

KS = (1, 10, 100)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that at least one of ``k`` samples drawn without replacement from ``n``, of which ``c``
    are correct, is correct: 1 - C(n-c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    return 1.0 if n - c < k else 1.0 - comb(n - c, k) / comb(n, k)


def read_samples(path: str, known: set[str]) -> dict[str, list[str]]:
    """task_id -> its completions, in file order; every task_id must be one of the problems'."""
    samples: dict[str, list[str]] = {}
    for line, record in read_jsonl(Path(path), ("task_id", "completion")):
        task_id, completion = str(record["task_id"]), record["completion"]
        if task_id not in known:
            raise TaskDataError(f"{path}:{line}: task_id {task_id!r} is not a problem of the task data")
        if not isinstance(completion, str):
            raise TaskDataError(f"{path}:{line}: completion must be a string")
        samples.setdefault(task_id, []).append(completion)
    if not samples:
        raise TaskDataError(f"{path}: no samples")
    return samples


def score_completions(cfg: EvaluateConfig, workers: int = 2) -> dict:
    """Run every sample in the sandbox (``workers`` at a time), write the report, return the task's result."""
    from .report import format_table, status_summary, task_result, write_json, report_to_termination_message
    from .sandbox import humaneval_program, require_isolation, run_program
    from .tasks import load_task

    problems = {q.id: q for q in load_task("humaneval", cfg.taskDataPath[0], 0)}
    samples = read_samples(cfg.completions, set(problems))
    isolation = require_isolation(cfg.allowUnsandboxedCode)
    print(f"[evaluate] humaneval: running {sum(map(len, samples.values()))} completions of {len(samples)} problems "
          f"under {isolation.describe()}", file=sys.stderr, flush=True)
    jobs = [(task_id, i, text) for task_id, texts in samples.items() for i, text in enumerate(texts)]

    def run(job):
        task_id, _, text = job
        q = problems[task_id]
        return run_program(humaneval_program(q.prompt, text, q.reference, q.entry_point), cfg.codeTimeoutSeconds,
                           cfg.codeMemoryMb, isolation)

    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(run, jobs))
    outcomes = [Outcome(f"{task_id}#{i}", "humaneval", r.reason, "passed", r.passed, completion=text)
                for (task_id, i, text), r in zip(jobs, results)]
    result = task_result("humaneval", outcomes, time.perf_counter() - start)
    correct = {task_id: 0 for task_id in samples}
    for (task_id, _, _), r in zip(jobs, results):
        correct[task_id] += r.passed
    n_min = min(map(len, samples.values()))
    result["passAtK"] = {str(k): sum(pass_at_k(len(samples[t]), correct[t], k) for t in samples) / len(samples)
                         for k in KS if k <= n_min}
    result.update(problems=len(samples), samplesPerTask=n_min, sandbox=isolation.describe())
    print(format_table([result]), flush=True)
    print("pass@k: " + ", ".join(f"pass@{k}={v:.4f}" for k, v in result["passAtK"].items()), flush=True)
    target = Path(cfg.resultsPath) if cfg.resultsPath else Path(cfg.completions).parent / "evaluation_results.json"
    summary = status_summary([result], cfg.completions)
    write_json(target, {**summary, "sandbox": isolation.describe(), "results": [result]})
    print(f"[evaluate] results written to {target}", file=sys.stderr, flush=True)
    report_to_termination_message(summary)
    return result
