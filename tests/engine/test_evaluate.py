"""`ascend-engine evaluate` on tiny models: likelihoods equal transformers', layouts agree, a memorised set scores
100% while held-out questions stay near chance, and every generative task's checker runs end to end."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memorised import write_mmlu
from test_train_torchrun import VENV_BIN, assert_ok, free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from prep_support import build_tokenizer, write_jsonl  # noqa: E402

SUBJECTS = {"fox": ["jumps", "sleeps", "eats", "runs"], "data": ["tokens", "bytes", "words", "bits"]}


def evaluate(*flags: str, nproc: int = 1, timeout: int = 180) -> subprocess.CompletedProcess:
    if nproc == 1:
        cmd = [sys.executable, "-m", "ascend_engine.cli", "evaluate", "--device", "cpu", *flags]
    else:
        cmd = [str(VENV_BIN / "torchrun"), "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
               "--master-port", str(free_port()), "-m", "ascend_engine.cli", "evaluate", "--device", "cpu", *flags]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def random_qwen3(tmp_path_factory):
    """A random tiny HF Qwen3 (2 layers, hidden 64), its Megatron conversion, a tokenizer and an MMLU-format set
    plus a HellaSwag file (multi-token options: one row per option)."""
    from ascend_engine.cli import main
    from test_convert_models import make_hf_model

    root = tmp_path_factory.mktemp("eval")
    tok = build_tokenizer(root / "tok")
    make_hf_model("qwen3", root / "hf", vocab_size=512, num_hidden_layers=2, max_position_embeddings=512)
    questions = [(s, f"What does the quick brown {s} number {i} do?", options, "ABCD"[i % 4])
                 for s, options in SUBJECTS.items() for i in range(4)]
    mmlu = write_mmlu(root / "mmlu", questions)
    write_jsonl(root / "hellaswag.jsonl", [
        {"ctx": "The quick brown fox", "endings": ["jumps over the lazy dog.", "sleeps.", "eats well.",
                                                   "hold tokens back to back."], "label": 0,
         "activity_label": "Animals"},
        {"ctx": "Megatron indexed datasets", "endings": ["hold tokens back to back.", "jumps.", "exercise",
                                                         "user tool"], "label": 0, "activity_label": "Data"}])
    write_jsonl(root / "gsm8k.jsonl", [{"question": "The quick brown fox has 3 dogs and 4 more. How many?",
                                        "answer": "3 + 4 = 7\n#### 7"},
                                       {"question": "Tokens?", "answer": "#### 2"}])
    write_jsonl(root / "humaneval.jsonl", [{"task_id": "t/0", "prompt": "def add(a, b):\n", "entry_point": "add",
                                            "test": "def check(f):\n    assert f(2, 3) == 5\n"}])
    (root / "agieval").mkdir()
    write_jsonl(root / "agieval" / "math.jsonl", [
        {"passage": None, "question": "The quick brown fox has 3 dogs and 4 more. How many?", "options": None,
         "label": None, "answer": "$7$"},
        {"passage": None, "question": "Tokens?", "options": ["(A)2", "(B)3"], "label": "A", "answer": None}])
    (root / "AGI_fewshot.json").write_text(json.dumps(
        {"math": ["Problem 1.   Tokens?\nAnswer:2\n\nProblem 2.", "\nChoose from the following options:\n",
                  "\nAnswer:"]}))
    assert main(["convert", "--load-dir", str(root / "hf"), "--save-dir", str(root / "mg"),
                 "--target-tensor-parallel-size", "1", "--target-pipeline-parallel-size", "1"]) == 0
    return root, tok, mmlu


def _predictions(path: Path) -> list[dict]:
    return [p for r in json.loads(path.read_text())["results"] for p in r["predictions"]]


@pytest.mark.engine
def test_option_likelihoods_equal_transformers_log_probs(random_qwen3):
    """Straight from the HF directory (converted on the fly), with one few-shot example (a subject's prefix
    encoded once and reused across its batches of 3): every option's log-likelihood equals the sum of
    transformers' log-probs over the same tokens to 1e-4; ``--max-eval-samples 7`` keeps MMLU's first 7."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ascend_engine.evaluate.scoring import Prompter
    from ascend_engine.evaluate.tasks import load_task
    from ascend_engine.prep.templates import load_template

    root, tok, mmlu = random_qwen3
    out = root / "hf_results.json"
    proc = evaluate("--task", "mmlu", "hellaswag", "--task-data-path", str(mmlu), str(root / "hellaswag.jsonl"),
                    "--load", str(root / "hf"), "--tokenizer-name-or-path", str(tok), "--shot", "1",
                    "--evaluation-batch-size", "3", "--max-eval-samples", "7", "--results-path", str(out))
    assert_ok(proc)
    assert "mmlu" in proc.stdout and "(all)" in proc.stdout
    got = _predictions(out)
    hf = AutoModelForCausalLM.from_pretrained(root / "hf", dtype=torch.float32).eval()
    prompter = Prompter(AutoTokenizer.from_pretrained(tok), load_template("empty", None))
    questions = load_task("mmlu", str(mmlu), 1)[:7] + load_task("hellaswag", str(root / "hellaswag.jsonl"), 1)
    assert [p["id"] for p in got] == [q.id for q in questions]
    worst = 0.0
    for q, p in zip(questions, got):
        expected = []
        for ctx, cont in prompter.encode_choices([(q.context, option) for option in q.options]):
            with torch.no_grad():
                logprobs = torch.log_softmax(hf(torch.tensor([ctx + cont])).logits[0].double(), -1)
            expected.append(sum(float(logprobs[len(ctx) - 1 + j, t]) for j, t in enumerate(cont)))
        worst = max(worst, max(abs(a - b) for a, b in zip(p["scores"], expected)))
        assert p["prediction"] == q.options[max(range(len(expected)), key=expected.__getitem__)].strip()
    assert worst <= 1e-4, worst
    assert any(len(prompter.encode_choices([(q.context, q.options[0])])[0][1]) > 1 for q in questions)  # both paths ran


# The single-process and the DP2 run of the generative tasks also score MMLU: the one-process MMLU scores are the
# reference the other layouts are held to, and the DP2 run is that layout's MMLU run, so two launches serve both
# tests (a torchrun of two evaluating processes costs about half a minute here).
GENERATIVE = ("gsm8k", "humaneval", "agieval")


def _run_mmlu_and_generative_tasks(root: Path, tok: Path, mmlu: Path, dp: int) -> tuple[subprocess.CompletedProcess, Path]:
    out = root / f"mmlu_and_gen_results_dp{dp}.json"
    proc = evaluate("--task", "mmlu", *GENERATIVE, "--task-data-path", str(mmlu), str(root / "gsm8k.jsonl"),
                    str(root / "humaneval.jsonl"), str(root / "agieval"), "--few-shot-template", "-", "-", "-",
                    str(root / "AGI_fewshot.json"), "--load", str(root / "mg"), "--tokenizer-name-or-path", str(tok),
                    "--max-new-tokens", "6", "--results-path", str(out), nproc=dp)
    assert_ok(proc)
    assert [r["task"] for r in json.loads(out.read_text())["results"]] == ["mmlu", *GENERATIVE]
    return proc, out


@pytest.fixture(scope="module")
def mg_runs(random_qwen3) -> dict:
    """Lazily, per DP size: the TP1PP1 Megatron checkpoint evaluated on MMLU and the generative tasks in one run."""
    root, tok, mmlu = random_qwen3
    runs: dict[int, tuple[subprocess.CompletedProcess, Path]] = {}

    def get(dp: int) -> tuple[subprocess.CompletedProcess, Path]:
        if dp not in runs:
            runs[dp] = _run_mmlu_and_generative_tasks(root, tok, mmlu, dp)
        return runs[dp]

    return get


def _task_predictions(path: Path, *tasks: str) -> list[dict]:
    return [p for r in json.loads(path.read_text())["results"] if r["task"] in tasks for p in r["predictions"]]


@pytest.mark.engine
@pytest.mark.parametrize("dp", [1, 2], ids=["dp1", "dp2"])
def test_generative_tasks_continue_as_transformers_greedy_search(random_qwen3, mg_runs, dp):
    """GSM8K, HumanEval and AGIEval cloze prompts (AGIEval with a MindSpeed-LLM few-shot template file, its choice
    question scored in the same task): our greedy completion (KV-cached batch of prompts of different lengths)
    is transformers' greedy ``generate`` on the same model, one prompt at a time, cut at the task's stop
    sequences; HumanEval's verdict comes from the sandbox. At DP2 each replica answers its own share (one gsm8k
    question each, the one humaneval question on the first) and the gathered predictions are the same. (The run
    scores MMLU too, for the layout test below.)"""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ascend_engine.evaluate.answers import cut_at_stop
    from ascend_engine.evaluate.tasks import load_task

    root, tok, _ = random_qwen3
    _, out = mg_runs(dp)
    got = _task_predictions(out, *GENERATIVE)
    hf = AutoModelForCausalLM.from_pretrained(root / "hf", dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tok)
    questions = (load_task("gsm8k", str(root / "gsm8k.jsonl"), 0) + load_task("humaneval", str(root / "humaneval.jsonl"), 0)
                 + load_task("agieval", str(root / "agieval"), 0, str(root / "AGI_fewshot.json")))
    assert len(got) == len(questions) == 5 and questions[3].prompt.startswith("Problem 1.   Tokens?")
    assert got[4]["id"] == "math.jsonl:2" and len(got[4]["scores"]) == 2  # the choice question, by likelihood
    for q, p in zip(questions[:4], got):
        ids = tokenizer(q.prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = hf.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.eos_token_id, output_scores=True, return_dict_in_generate=True)
        new = out.sequences[0, ids.shape[1]:]
        text = tokenizer.decode(new[new != tokenizer.eos_token_id], skip_special_tokens=True)
        if p["completion"] != cut_at_stop(text, q.stop):
            # tolerance parity: our tokens may part from transformers' only after a near tie (top-two logits
            # within 1e-3) at or before the first token whose text ours does not continue
            parted = next((k for k in range(len(new)) if not p["completion"].startswith(
                cut_at_stop(tokenizer.decode(new[:k + 1], skip_special_tokens=True), q.stop))), len(new) - 1)
            gaps = [float(s[0].topk(2).values.diff().abs()) for s in out.scores[:parted + 1]]
            assert min(gaps) < 1e-3, (p, text, gaps)
            print(f"{q.id}: a near tie (top-two gap {min(gaps):.2e}) before ours parts from transformers")
    assert got[2]["correct"] is False and got[2]["prediction"].startswith("failed")  # random code fails its test


@pytest.mark.engine
@pytest.mark.parametrize("layout", [("2", "1", 2), ("1", "2", 2), ("1", "1", 2)], ids=["tp2", "pp2", "dp2"])
def test_layouts_give_identical_predictions(random_qwen3, mg_runs, layout):
    """The TP1PP1 Megatron checkpoint evaluated at TP2 and PP2 (resharded on the fly) and at DP2 (two replicas,
    each scoring half the questions) predicts the same option for every question as at TP1PP1 (one process, its
    own layout), with the same likelihoods (fp32 reductions in another order: 1e-4). The TP1PP1 reference and the
    DP2 run are the generative test's runs, which score MMLU too."""
    root, tok, mmlu = random_qwen3
    tp, pp, nproc = layout
    _, reference = mg_runs(1)
    if (tp, pp) == ("1", "1"):
        proc, out = mg_runs(nproc)
    else:
        out = root / f"tp{tp}pp{pp}_world{nproc}.json"
        proc = evaluate("--task", "mmlu", "--task-data-path", str(mmlu), "--load", str(root / "mg"),
                        "--tokenizer-name-or-path", str(tok), "--tensor-model-parallel-size", tp,
                        "--pipeline-model-parallel-size", pp, "--results-path", str(out), nproc=nproc)
        assert_ok(proc)
    for stage in ("joining the process group", "loading the model", "mmlu: "):  # said once, by rank 0
        assert proc.stderr.count(f"s {stage}") == 1, proc.stderr[-3000:]
    ref, got = _task_predictions(reference, "mmlu"), _task_predictions(out, "mmlu")
    assert len(ref) == 8 and [p["prediction"] for p in got] == [p["prediction"] for p in ref]
    for a, b in zip(got, ref):
        assert max(abs(x - y) for x, y in zip(a["scores"], b["scores"])) <= 1e-4


@pytest.mark.engine
def test_vocabulary_mismatch_is_refused_with_both_sizes(random_qwen3, tmp_path):
    from test_convert_models import make_hf_model

    root, tok, mmlu = random_qwen3
    make_hf_model("qwen3", tmp_path / "small", vocab_size=128, num_hidden_layers=2, max_position_embeddings=512)
    proc = evaluate("--task", "mmlu", "--task-data-path", str(mmlu), "--load", str(tmp_path / "small"),
                    "--tokenizer-name-or-path", str(tok), "--results-path", str(tmp_path / "r.json"))
    assert proc.returncode == 2
    assert "has 400 tokens" in proc.stderr and "vocabulary of 128" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "r.json").exists()


@pytest.mark.engine
def test_a_memorised_set_scores_full_marks_and_held_out_questions_stay_near_chance(memorised, tmp_path):
    """A tiny model trained on 8 MMLU-format questions with their answers (``memorised.py``), evaluated
    zero-shot, answers all 8 and does no better than guessing on 8 held-out questions of the same form (answers
    balanced A-D). The checkpoint's training run was tracked (an offline W&B run beside it): the results join it."""
    from ascend_engine.config.tracking import TrackerConfig
    from ascend_engine.train.trackers import RUNS_FILE, write_runs

    tok, mmlu, ckpt = (str(memorised[k]) for k in ("tokenizer", "mmlu", "checkpoint"))
    one_process = ("--pipeline-model-parallel-size", "1")  # the PP=2 checkpoint, resharded on load
    tracker = TrackerConfig(type="wandb", mode="offline", dir=str(tmp_path / "wb"))
    tracked = importlib.util.find_spec("wandb") is not None
    if tracked:
        write_runs(ckpt, {tracker.key(): {"key": tracker.key(), "tracker": "wandb", "runId": "memorised1",
                                          "config": tracker.to_yaml_dict()}})
    try:
        assert_ok(evaluate("--task", "mmlu", "--task-data-path", mmlu, "--load", ckpt, "--tokenizer-name-or-path",
                           tok, *one_process))
    finally:
        (Path(ckpt) / RUNS_FILE).unlink(missing_ok=True)
    # the report lands next to the checkpoint when no path is given
    report = json.loads((Path(ckpt) / "evaluation_results.json").read_text())
    if tracked:
        from test_train_observability import wandb_run

        logged = wandb_run(next((tmp_path / "wb" / "wandb").glob("offline-run-*-memorised1")))
        iteration = int((Path(ckpt) / "latest_checkpointed_iteration.txt").read_text())
        assert logged["id"] == "memorised1" and logged["history"][0]["iteration"] == iteration
        assert logged["history"][0]["eval/mmlu/accuracy"] == pytest.approx(report["tasks"][0]["accuracy"], abs=1e-6)
    subjects = report["results"][0]["subjects"]
    accuracy = {name: subjects[name]["accuracy"] for name in ("seen", "held_out")}
    assert subjects["seen"]["samples"] == subjects["held_out"]["samples"] == 8, subjects
    assert accuracy["seen"] == 1.0, (accuracy, memorised["losses"][-5:])
    assert accuracy["held_out"] <= 0.5, accuracy
