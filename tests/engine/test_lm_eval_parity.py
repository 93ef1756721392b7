"""lm-evaluation-harness on our engine: three tiny local lm-eval tasks (multiple choice by log-likelihood, greedy
generation with stop sequences, rolling log-likelihood perplexity), run by lm-eval's own HF backend (``--model hf``)
on a random tiny HF Qwen3 and by ``ascend-engine evaluate --backend lm-eval`` on its Megatron conversion, as two
data-parallel replicas: the same answers, the same generations, the same metrics. And lm-eval's
own ``mmlu`` (the group of 57 subjects), ``hellaswag`` and ``gsm8k``, task definitions unchanged, reading tiny
fabricated copies of their hub datasets from a local folder (``--datasets-dir``, tests/unit/lm_eval_datasets.py).

The model's window is 128 positions, so the few-shot multiple-choice contexts are cut from the left, the
perplexity texts take several rolling windows, and generation keeps the prompt's last 128 - max_gen_toks tokens:
every truncation rule is held to the HF backend's too.

Log-likelihoods and the metrics made from them agree within float32's rounding (tests/float_bounds.py): delta =
sqrt(K = 512, the vocabulary) x (2 layers + 2) x 2**-24 = 5.4e-6. A log-likelihood sums n tokens' log-probabilities,
each about ln 512 in size for this random model, their rounding adding as a random walk: delta x sqrt(n) x ln 512,
with n about |ll| / ln 512: delta x sqrt(|ll| x ln 512), at least delta x ln 512 (3.4e-5 for one token, 6e-4 for a
rolling log-likelihood of -2000). A perplexity exp(-sum ll / words) moves by its log times that relative rounding:
delta x max(1, |ln value|) of its value; bits per byte by delta of its value. The former allowance was 1e-4 of
each value (at least 1e-4), 3-300x wider."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from float_bounds import model_delta
from lm_eval.utils import handle_non_serializable

from ascend_engine.evaluate.harness import logged_sample
from test_evaluate import evaluate
from test_train_torchrun import assert_ok

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from lm_eval_datasets import write_lm_eval_datasets  # noqa: E402
from prep_support import CORPUS, build_tokenizer, write_jsonl  # noqa: E402

TASKS = ["tiny_mc", "tiny_gen", "tiny_ppl"]
HUB_TASKS = ["mmlu", "hellaswag", "gsm8k"]  # lm-eval's own, their datasets from --datasets-dir
GENERATIVE = {"tiny_gen", "gsm8k"}
GEN_TOKS = 16  # gsm8k names no max_gen_toks: lm-eval's HF backend's 256 would not fit the 128-position window
WORDS = " ".join(dict.fromkeys(CORPUS)).split()


def _task_files(root: Path) -> Path:
    """Data (jsonl) and the three task YAMLs, naming their data files by absolute path (no hub)."""
    folder = root / "tasks"
    folder.mkdir()
    mc = [{"question": " ".join(WORDS[i: i + 3 + i % 4]) + "?", "choices": [WORDS[(i + k) % len(WORDS)] for k in
                                                                          range(3 + i % 2)] + ["quick brown fox"],
           "label": i % 3} for i in range(8)]
    write_jsonl(root / "mc_train.jsonl", mc[:3])
    write_jsonl(root / "mc_test.jsonl", mc[3:])
    write_jsonl(root / "gen_test.jsonl", [{"question": " ".join(WORDS[i: i + 2 + i]), "answer": WORDS[i]}
                                          for i in range(5)])
    # about 40, 200 and 330 tokens: one, two and three rolling windows of 128
    write_jsonl(root / "ppl_test.jsonl", [{"text": " ".join(CORPUS[:n])} for n in (3, 14, 22)])
    head = "dataset_path: json\ndataset_kwargs:\n  data_files:\n"
    (folder / "tiny_mc.yaml").write_text(
        f"task: tiny_mc\n{head}    train: {root / 'mc_train.jsonl'}\n    test: {root / 'mc_test.jsonl'}\n"
        "training_split: train\ntest_split: test\nfewshot_split: train\nnum_fewshot: 2\n"
        "output_type: multiple_choice\ndoc_to_text: \"Question: {{question}}\\nAnswer:\"\n"
        "doc_to_choice: choices\ndoc_to_target: label\n"
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\nmetadata:\n  version: 1.0\n")
    (folder / "tiny_gen.yaml").write_text(
        f"task: tiny_gen\n{head}    test: {root / 'gen_test.jsonl'}\ntest_split: test\n"
        "output_type: generate_until\ndoc_to_text: \"Q: {{question}}\\nA:\"\ndoc_to_target: \"{{answer}}\"\n"
        "generation_kwargs:\n  until: [\"\\n\\n\", \"Q:\"]\n  do_sample: false\n  max_gen_toks: 12\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
        "metadata:\n  version: 1.0\n")
    (folder / "tiny_ppl.yaml").write_text(
        f"task: tiny_ppl\n{head}    test: {root / 'ppl_test.jsonl'}\ntest_split: test\n"
        "output_type: loglikelihood_rolling\ndoc_to_text: \"\"\ndoc_to_target: \"{{text}}\"\n"
        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n"
        "metadata:\n  version: 1.0\n")
    return folder


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    """A random tiny HF Qwen3 (2 layers, 128 positions), its TP1 Megatron conversion, a tokenizer, the tasks,
    and lm-eval's HF backend's results on them (in this process: lm-eval's ``simple_evaluate``)."""
    from transformers import AutoTokenizer

    from ascend_engine.cli import main
    from test_convert_models import make_hf_model

    root = tmp_path_factory.mktemp("lm_eval")
    tok = build_tokenizer(root / "tok")
    make_hf_model("qwen3", root / "hf", vocab_size=512, num_hidden_layers=2, max_position_embeddings=128)
    # HF's generate stops at its generation config's end token: make it the tokenizer's, where we stop
    eos = AutoTokenizer.from_pretrained(tok).eos_token_id
    for name in ("config.json", "generation_config.json"):
        if (root / "hf" / name).is_file():
            config = json.loads((root / "hf" / name).read_text())
            (root / "hf" / name).write_text(json.dumps({**config, "eos_token_id": eos, "pad_token_id": eos}))
    assert main(["convert", "--load-dir", str(root / "hf"), "--save-dir", str(root / "mg"),
                 "--target-tensor-parallel-size", "1", "--target-pipeline-parallel-size", "1"]) == 0
    tasks = _task_files(root)
    write_lm_eval_datasets(root / "hub")

    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from ascend_engine.evaluate.harness_tasks import LocalDatasets, offline

    class HF(HFLM):
        @property
        def max_gen_toks(self) -> int:
            return GEN_TOKS

    offline()
    hf = HF(pretrained=str(root / "hf"), tokenizer=str(tok), dtype="float32", device="cpu", batch_size=1)
    manager = TaskManager(include_path=str(tasks))
    manager._factory = LocalDatasets(str(root / "hub"))  # as --datasets-dir does
    reference = lm_eval.simple_evaluate(model=hf, tasks=TASKS + HUB_TASKS, task_manager=manager,
                                        bootstrap_iters=0, log_samples=True)
    from lm_eval.utils import handle_non_serializable

    reference = json.loads(json.dumps(reference, default=handle_non_serializable))
    return root, tok, tasks, reference, manager


def _ours(harness, nproc: int) -> tuple[dict, dict[str, list[dict]]]:
    root, tok, tasks = harness[:3]
    out = root / f"ours_{nproc}.json"
    more = [*HUB_TASKS, "--datasets-dir", str(root / "hub"), "--max-new-tokens", str(GEN_TOKS)]
    proc = evaluate("--backend", "lm-eval", "--task", *TASKS, *more, "--include-path", str(tasks),
                    "--load", str(root / "mg"), "--tokenizer-name-or-path", str(tok), "--bootstrap-iters", "0",
                    "--evaluation-batch-size", "4", "--results-path", str(out), nproc=nproc, timeout=300)
    assert_ok(proc)
    assert "tiny_mc" in proc.stdout and "word_perplexity" in proc.stdout  # lm-eval's table
    stem = f"ours_{nproc}_samples_"
    samples = {p.name[len(stem):-len(".jsonl")]: [json.loads(line) for line in p.read_text().splitlines()]
               for p in root.glob(f"{stem}*.jsonl")}
    return json.loads(out.read_text()), samples


DELTA = model_delta({"numLayers": 2, "hiddenSize": 64, "numAttentionHeads": 4, "vocabSize": 512}, 128)
LOG_V = math.log(512)


def _close_ll(a: float, b: float) -> bool:
    """Two log-likelihoods within float32's rounding of a sum of about |b| / ln 512 token log-probabilities."""
    return abs(a - b) <= DELTA * max(math.sqrt(abs(b) * LOG_V), LOG_V)


def _close_metric(a: float, b: float) -> bool:
    """A perplexity or bits per byte within float32's rounding: delta x max(1, |ln b|) of b."""
    return abs(a - b) <= DELTA * max(1.0, abs(math.log(abs(b)))) * abs(b) if b else a == b


@pytest.mark.engine
def test_lm_eval_tasks_equal_lm_evals_hf_backend(harness):
    """Per document: each choice's log-likelihood (to 1e-4 relative) and is_greedy, so the same answer; the same
    greedy generation, cut at the same stop; the same rolling log-likelihood of each text. Per task: the same
    acc, acc_norm and exact_match, and word/byte perplexity and bits per byte to 1e-4 relative. lm-eval's results
    format (results, configs, versions, n-samples) is what we write. lm-eval's mmlu (57 subjects and the group's
    size-weighted accuracy), hellaswag (acc, acc_norm) and gsm8k (5-shot, both filters' exact_match) from the
    local datasets folder: the same. Two data-parallel processes, so each shares out the requests and gathers
    the answers (one process was a second launch of some 40 s that showed nothing more)."""
    reference, nproc = harness[3], 2
    ours, samples = _ours(harness, nproc)
    assert {"results", "configs", "versions", "n-samples", "n-shot"} <= set(ours)
    assert ours["config"]["data_parallel"] == nproc
    worst = 0.0
    assert set(samples) == set(reference["samples"]) and len(samples) == len(TASKS) + 57 + 2
    for task in samples:
        mine = sorted(samples[task], key=lambda s: (s["doc_id"], s["filter"]))
        # lm-eval's own --log_samples record of the reference (what our files hold: numbers as strings)
        theirs = [json.loads(json.dumps(logged_sample(s), default=handle_non_serializable))
                  for s in sorted(reference["samples"][task], key=lambda s: (s["doc_id"], s["filter"]))]
        assert [s["doc_id"] for s in mine] == [s["doc_id"] for s in theirs] and mine
        for a, b in zip(mine, theirs):
            assert a["arguments"] == b["arguments"]  # the same prompts (few-shot examples, windows' text)
            if task in GENERATIVE:
                assert a["resps"] == b["resps"] and a["filtered_resps"] == b["filtered_resps"], (a, b)
                continue
            got, want = a["filtered_resps"], b["filtered_resps"]
            if task == "tiny_ppl":
                got, want = [[x] for x in got], [[x] for x in want]
            got = [[float(x[0]), *x[1:]] for x in got]
            want = [[float(x[0]), *x[1:]] for x in want]
            for (ll, *greedy), (ll_hf, *greedy_hf) in zip(got, want):
                worst = max(worst, abs(ll - ll_hf) / (DELTA * max(math.sqrt(abs(ll_hf) * LOG_V), LOG_V)))
                assert _close_ll(ll, ll_hf), (task, a["doc_id"], ll, ll_hf)
                assert greedy == greedy_hf
            if task != "tiny_ppl":
                assert max(range(len(got)), key=lambda k: got[k][0]) == max(range(len(want)),
                                                                             key=lambda k: want[k][0])
    assert {"mmlu", "mmlu_stem", "hellaswag", "gsm8k"} <= set(reference["results"])
    for task in reference["results"]:
        for metric, value in reference["results"][task].items():
            if "," not in metric or "_stderr" in metric:
                continue
            if metric.startswith(("acc", "exact_match")):
                assert ours["results"][task][metric] == value, (task, metric)
            else:
                assert _close_metric(ours["results"][task][metric], value), (task, metric,
                                                                             ours["results"][task][metric])
    for task in ("tiny_gen", "gsm8k"):
        generated = [s["resps"][0][0] for s in samples[task]]
        assert any(g.strip() for g in generated), generated  # parity of something, not of empty strings
    assert ours["n-samples"]["gsm8k"]["effective"] == 2 and ours["n-shot"]["gsm8k"] == 5
    print(f"lm-eval parity at {nproc} process(es): at most {worst:.2f} of the float32 bound on a log-likelihood")


@pytest.mark.engine
def test_status_carries_lm_evals_metrics(harness):
    """status.evaluation of an lm-eval run: per task lm-eval's metric values, accuracy where the task has one,
    a perplexity task's first metric in the summary; a group (mmlu) its aggregate over its subjects."""
    from ascend_engine.evaluate.report import lm_eval_summary
    from ascend_operator.api.evaluation import EvaluationStatus

    summary = lm_eval_summary(harness[3], TASKS + HUB_TASKS, "/ckpt", 3.0)
    status = EvaluationStatus.model_validate(summary)
    by_task = {t.task: t for t in status.tasks}
    assert by_task["mmlu"].metric == "acc,none" and by_task["mmlu"].samples == 57  # the group: its subjects' docs
    assert set(by_task["hellaswag"].metrics) == {"acc,none", "acc_norm,none"} and by_task["hellaswag"].samples == 2
    assert set(by_task["gsm8k"].metrics) == {"exact_match,strict-match", "exact_match,flexible-extract"}
    assert by_task["tiny_mc"].metric == "acc,none" and by_task["tiny_mc"].samples == 5
    assert set(by_task["tiny_mc"].metrics) == {"acc,none", "acc_norm,none"}
    assert by_task["tiny_ppl"].accuracy is None and by_task["tiny_ppl"].metric == "word_perplexity,none"
    assert "tiny_ppl:word_perplexity=" in status.summary and status.backend == "lm-eval" and status.seconds == 3.0
    assert by_task["tiny_mc"].seconds is None  # lm-eval batches all tasks together: the run has a time


@pytest.mark.engine
def test_a_missing_local_dataset_is_named_before_the_model_loads(harness, tmp_path):
    """datasetsDir without one of the datasets a requested group needs: the error names the task, its hub dataset
    and the folder looked in (checked by walking the group's members, no data read, before any model)."""
    from ascend_engine.config.evaluate import EvaluateConfig
    from ascend_engine.evaluate.harness_tasks import use_local_datasets
    from ascend_engine.evaluate.questions import TaskDataError

    manager = harness[4]
    (tmp_path / "openai").mkdir()
    (tmp_path / "openai" / "gsm8k").symlink_to(harness[0] / "hub" / "openai" / "gsm8k")
    cfg = EvaluateConfig(task=["gsm8k", "mmlu"], backend="lm-eval", tokenizerNameOrPath=str(harness[1]),
                         datasetsDir=str(tmp_path))
    factory = manager._factory
    try:
        with pytest.raises(TaskDataError, match=r"mmlu_\w+: its dataset cais/mmlu is not in datasetsDir: no folder "
                           + str(tmp_path / "cais" / "mmlu")):
            use_local_datasets(manager, cfg)
    finally:
        manager._factory = factory
