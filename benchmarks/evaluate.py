"""Evaluation speed, ours vs transformers on the same model, side by side at the same batch sizes: choice-task
scoring (questions/s) or, with ``--generate N``, greedy generation of N new tokens per question (new tokens/s).

A random Qwen3-shaped HF model is saved, converted to a Megatron checkpoint with our converter and loaded the way
``ascend-engine evaluate`` loads it. Choice scoring reads a real MMLU-layout set (``test/<subject>_test.csv``,
``dev/<subject>_dev.csv``) of random words written for the run, through the evaluation's own task reader
(``--shot`` examples from dev before each question, as MMLU is evaluated 5-shot), a word-level HF tokenizer and
``score_choices`` (the evaluation's batching, and its reuse of a subject's shared prefix). Each question (with its
four options and the answer cue) is ``--question-tokens`` tokens (+-25%), and so is each few-shot example.
The peer is ``transformers`` at its best settings without prefix caching (its normal evaluation path): sdpa
attention, ``inference_mode``, prompts sorted by length and batched, left-padded with an attention mask and
position ids, logits only for the last position (``logits_to_keep=1``), its questions tokenized in one batched
call (both sides' times include tokenizing). Its log-likelihoods are checked equal to ours (1e-4) before timing.
``--shots 5 0`` runs a few-shot and a zero-shot block in one invocation.

With ``--generate N`` each random prompt of ``--prompt-tokens`` is continued greedily by exactly N tokens (no
end-of-sequence) through ``generate_answers``'s model call; the first two batches' tokens must agree with
transformers' (left padding, KV cache). With ``--varied-ends`` too, each response ends at its first stop token,
one drawn at a random point of each row's full response, as real answers (GSM8K's) end at different lengths:
transformers gets them as its end-of-sequence list, runs a batch until its last row ends (lm-evaluation-harness'
way with transformers), and ours also runs as it did before continuous batching (``ours, batches``). ``--whole-process`` times whole processes instead: ``ascend-engine
evaluate`` on the Megatron checkpoint against a transformers script that loads the HF directory and scores the
same prompts (start-up, loading and reading counted on both sides); with ``--generate N`` too, ``evaluate
--task gsm8k`` on GSM8K-layout prompts against a transformers script generating for them (completions checked
equal).

Rounds interleave the variants so drift in machine load hits all alike; median and spread of the rates and of
the per-round ratios are printed.

    python benchmarks/evaluate.py [--device cpu|cuda] [--questions 256 --question-tokens 40 --shots 5 0 --batch 16]
    python benchmarks/evaluate.py --whole-process --questions 256 --shots 5
    python benchmarks/evaluate.py --generate 128 --questions 16 --prompt-tokens 200 --batch 16
    python benchmarks/evaluate.py --whole-process --generate 128 --questions 32
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

SUBJECT_WORDS = "The following are multiple choice questions ( with answers ) about . Answer : A B C D".split()


def write_tokenizer(directory: Path, words: int) -> None:
    """A word-level HF tokenizer: ``w0 .. w{words-1}``, the prompt's own words and punctuation, one token each."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<unk>", "<eos>", *dict.fromkeys(SUBJECT_WORDS),
                                         *(f"w{n}" for n in range(words))])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>").save_pretrained(directory)


def write_mmlu(root: Path, questions: int, subjects: int, shots: int, tokens: int, words: int) -> Path:
    """MMLU's layout with random-word questions of ``tokens`` (+-25%) tokens each, question and options and cue."""
    import random

    rng = random.Random(1)

    def row():
        n = rng.randint(int(tokens * 0.75), int(tokens * 1.25))
        options = [" ".join(f"w{rng.randrange(words)}" for _ in range(3)) for _ in range(4)]
        question = " ".join(f"w{rng.randrange(words)}" for _ in range(max(4, n - 22)))  # options + cue: 22
        return [question, *options, "ABCD"[rng.randrange(4)]]

    for split, count in (("test", questions // subjects), ("dev", max(shots, 1))):
        (root / split).mkdir(parents=True, exist_ok=True)
        for k in range(subjects):
            with open(root / split / f"subject{k}_{split}.csv", "w", newline="") as f:
                csv.writer(f).writerows(row() for _ in range(count))
    return root / "test"


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):9.2f}  (min {min(values):.2f}, max {max(values):.2f})"


def report(title: str, rates: dict[str, list[float]], unit: str, cpu: dict[str, list[float]] | None = None) -> None:
    print(title)
    for key, values in rates.items():
        used = f"; CPU s per round {statistics.median(cpu[key]):.1f} (min {min(cpu[key]):.1f})" if cpu else ""
        print(f"  {key:<13} {spread(values)} {unit}{used}")
    for key in rates:
        if key != "transformers":
            ratios = [o / t for o, t in zip(rates[key], rates["transformers"])]
            print(f"  {key} / transformers per round: median {statistics.median(ratios):.2f} "
                  f"(min {min(ratios):.2f}, max {max(ratios):.2f})", flush=True)  # shows before the next block ends


CPU: dict[str, list[float]] = {}  # CPU seconds of each variant's rounds (this process and its children)


def cpu_seconds() -> float:
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def interleave(variants: dict, rounds: int, amount: float) -> dict[str, list[float]]:
    """Rates per round; the rounds' CPU seconds land in ``CPU`` (wall time on a loaded machine says little alone)."""
    rates: dict[str, list[float]] = {k: [] for k in variants}
    CPU.clear()
    print(f"  ({rounds} rounds of {', '.join(variants)}; load average {os.getloadavg()[0]:.1f} at the start)",
          flush=True)
    for _ in range(rounds):
        for key, fn in variants.items():
            start, used = time.perf_counter(), cpu_seconds()
            fn()
            rates[key].append(amount / (time.perf_counter() - start))
            CPU.setdefault(key, []).append(cpu_seconds() - used)
    return rates


PEER_SCRIPT = r"""
import sys, time, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
sys.path.insert(0, sys.argv[5])
from evaluate import peer_scores
from ascend_engine.evaluate.tasks import load_task
torch.set_num_threads(int(sys.argv[4]) or torch.get_num_threads())
tok = AutoTokenizer.from_pretrained(sys.argv[1])
device = torch.device(sys.argv[6])
hf = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32, attn_implementation="sdpa")
hf = hf.eval().to(device)
questions = load_task("mmlu", sys.argv[2], int(sys.argv[3]))
rows = tok([q.context for q in questions])["input_ids"]
letters = [tok(questions[0].context + o)["input_ids"][-1] for o in questions[0].options]
scores = peer_scores(hf, rows, letters, int(sys.argv[7]), device)
right = sum(max(range(4), key=s.__getitem__) == q.gold for s, q in zip(scores, questions))
print(f"accuracy {right / len(questions):.4f}")
"""


def peer_scores(hf, rows: list[list[int]], letters: list[int], b: int, device) -> list[list[float]]:
    """transformers' best scoring: rows sorted by length, left-padded batches with an attention mask and position
    ids, logits of the last position only; each row's log-probs of ``letters``, in the rows' order."""
    import torch

    order = sorted(range(len(rows)), key=lambda i: len(rows[i]), reverse=True)
    out: list = [None] * len(rows)
    with torch.inference_mode():
        for i in range(0, len(order), b):
            chunk = order[i: i + b]
            width = max(len(rows[j]) for j in chunk)
            ids = torch.zeros(len(chunk), width, dtype=torch.long)
            mask = torch.zeros(len(chunk), width, dtype=torch.long)
            for k, j in enumerate(chunk):
                ids[k, width - len(rows[j]):], mask[k, width - len(rows[j]):] = torch.tensor(rows[j]), 1
            ids, mask = ids.to(device), mask.to(device)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = hf(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1).logits
            got = torch.log_softmax(logits[:, -1].float(), -1)[:, letters].tolist()
            for j, values in zip(chunk, got):
                out[j] = values
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "npu"])
    ap.add_argument("--hidden-size", type=int, default=512)
    ap.add_argument("--num-layers", type=int, default=8)
    ap.add_argument("--vocab-size", type=int, default=32000)
    ap.add_argument("--questions", type=int, default=256)
    ap.add_argument("--subjects", type=int, default=4, help="choice scoring: subjects the questions are split into")
    ap.add_argument("--question-tokens", type=int, default=40, help="choice scoring: mean tokens of a question "
                    "with its options, and of each few-shot example (+-25%%)")
    ap.add_argument("--shots", type=int, nargs="+", default=[5, 0], help="choice scoring: one block per value")
    ap.add_argument("--prompt-tokens", type=int, default=200, help="generation: mean prompt length (+-25%%)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads for both (0: torch's default)")
    ap.add_argument("--generate", type=int, default=0, metavar="N", help="benchmark generation of N new tokens")
    ap.add_argument("--varied-ends", action="store_true", help="generation: each response ends at its first stop "
                    "token (drawn from the responses), as real answers end at different lengths")
    ap.add_argument("--whole-process", action="store_true", help="time whole processes (start-up counted)")
    args = ap.parse_args()
    for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"):
        os.environ.pop(k, None)

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from ascend_engine.cli import main as engine
    from ascend_engine.device import select_backend
    from ascend_engine.evaluate.model import InferenceModel
    from ascend_engine.evaluate.scoring import Prompter, by_length, score_choices
    from ascend_engine.evaluate.tasks import load_task
    from ascend_engine.generate.loading import load_model, read_args
    from ascend_engine.parallel import destroy_parallel, init_parallel
    from ascend_engine.prep.templates import load_template

    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="bench-eval-"))
    config = AutoConfig.for_model("qwen3", vocab_size=args.vocab_size, hidden_size=args.hidden_size,
                                  intermediate_size=args.hidden_size * 3, num_hidden_layers=args.num_layers,
                                  num_attention_heads=8, num_key_value_heads=4, head_dim=args.hidden_size // 8,
                                  max_position_embeddings=4096, tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa").eval()
    hf.save_pretrained(work / "hf")
    words = args.vocab_size - 100
    write_tokenizer(work / "hf", words)
    assert engine(["convert", "--load-dir", str(work / "hf"), "--save-dir", str(work / "mg")]) == 0
    machine = (f"hidden {args.hidden_size}, {args.num_layers} layers, vocab {args.vocab_size}, fp32, device "
               f"{args.device}, batch {args.batch}, {args.threads or torch.get_num_threads()} threads, "
               f"{args.rounds} interleaved rounds")
    if args.whole_process:
        (whole_process_generation if args.generate else whole_process)(args, work, words, machine)
        shutil.rmtree(work, ignore_errors=True)
        return
    backend = select_backend(args.device)
    backend.apply()
    info = init_parallel(backend, 1, 1, seed=0)
    iteration, ckpt_args = read_args(str(work / "mg"))
    model_cfg, gpt, max_len = load_model(str(work / "mg"), iteration, ckpt_args, 0, 0, backend.torch_device)
    ours = InferenceModel(gpt, model_cfg.vocabSize, max_len, info, backend.torch_device)
    hf.to(backend.torch_device)
    device = backend.torch_device
    b = args.batch

    class Quiet:
        def update(self, n):
            pass

    if not args.generate:
        tokenizer = AutoTokenizer.from_pretrained(work / "hf")
        prompter = Prompter(tokenizer, load_template("empty", None))
        for shot in args.shots:
            data = write_mmlu(work / f"mmlu{shot}", args.questions, args.subjects, shot, args.question_tokens,
                              words)
            questions = load_task("mmlu", str(data), shot)
            letters = [c[0] for _, c in prompter.encode_choices([(questions[0].context, o)
                                                                 for o in questions[0].options])]

            def score_ours(questions=questions):
                ours._prefix = None  # every round encodes its prefixes anew
                return [s for _, s in score_choices(ours, prompter, questions, b, Quiet())]

            def score_hf(questions=questions):  # tokenizing counted, as in ours: one batched call
                rows = tokenizer([q.context for q in questions])["input_ids"]
                return peer_scores(hf, rows, letters, b, device)

            with counting_tokens() as computed:
                ours_first = score_ours()
            worst = max(abs(x - y) for a, c in zip(ours_first, score_hf()) for x, y in zip(a, c))
            assert worst <= 1e-4, f"our option log-likelihoods differ from transformers' by {worst}"
            rates = interleave({"ours": score_ours, "transformers": score_hf}, args.rounds, len(questions))
            mean = statistics.mean(len(ids) for ids in tokenizer([q.context for q in questions])["input_ids"])
            report(f"{len(questions)} questions in {args.subjects} subjects, {shot}-shot, prompts of {mean:.0f} "
                   f"tokens on average (questions and examples ~{args.question_tokens} tokens +-25%), choice "
                   f"scoring; {machine}; log-likelihoods equal to {worst:.1e}; load average "
                   f"{os.getloadavg()[0]:.1f}", rates, "questions/s", CPU)
            if args.device == "cpu":
                products_floor(gpt, computed, CPU["ours"], len(questions))
    else:
        generate_side_by_side(args, ours, hf, device, by_length)
    destroy_parallel()
    shutil.rmtree(work, ignore_errors=True)


@contextmanager
def counting_tokens():
    """The tokens our scoring's forwards compute (prefixes and padded rows), counted where the cache is told
    about them: a list holding one number, filled when the block ends."""
    from unittest import mock

    from ascend_engine.models.ragged_cache import RaggedKVCache

    counts, prefill, extend = [0], RaggedKVCache.prefill, RaggedKVCache.extend

    def counted_prefill(self, rows, length):
        counts[0] += len(rows) * length
        return prefill(self, rows, length)

    def counted_extend(self, rows, start, length, device):
        counts[0] += rows * length
        return extend(self, rows, start, length, device)

    with mock.patch.object(RaggedKVCache, "prefill", counted_prefill), \
            mock.patch.object(RaggedKVCache, "extend", counted_extend):
        yield counts


def products_floor(gpt, computed: list[int], cpu: list[float], questions: int) -> None:
    """The physical limit: our scoring's matrix products (every layer's linears at each computed token, the
    output layer at each question's one read position) at this core's peak, measured here on a 2048^3 product."""
    import torch

    layers = sum(p.numel() for name, p in gpt.decoder.named_parameters() if name.endswith("weight") and p.dim() == 2)
    flops = 2 * (computed[0] * layers + questions * gpt.output_layer.weight.numel())
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    torch.mm(a, b)
    peaks = []
    for _ in range(5):
        start = time.process_time()
        torch.mm(a, b)
        peaks.append(2 * 2048 ** 3 / (time.process_time() - start))
    peak = statistics.median(peaks)
    print(f"  products floor: {computed[0]} tokens computed, {flops / 1e9:.0f} GFLOP of products, "
          f"{flops / peak:.1f} CPU s at this core's peak ({peak / 1e9:.1f} GFLOP/s per thread); ours "
          f"{statistics.median(cpu) * peak / flops:.2f}x that floor", flush=True)


def whole_process(args, work: Path, words: int, machine: str) -> None:
    """``ascend-engine evaluate`` (one process, Megatron checkpoint) against a transformers script (one process,
    HF directory) on the same MMLU files; seconds from launch to exit, start-up included."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads or os.cpu_count())}
    here = str(Path(__file__).resolve().parent)
    for shot in args.shots:
        data = write_mmlu(work / f"mmlu{shot}", args.questions, args.subjects, shot, args.question_tokens, words)
        ours = [sys.executable, "-m", "ascend_engine.cli", "evaluate", "--device", args.device, "--task", "mmlu",
                "--task-data-path", str(data), "--load", str(work / "mg"), "--tokenizer-name-or-path",
                str(work / "hf"), "--shot", str(shot), "--evaluation-batch-size", str(args.batch),
                "--results-path", str(work / "results.json")]
        peer = [sys.executable, "-c", PEER_SCRIPT, str(work / "hf"), str(data), str(shot), str(args.threads), here,
                args.device, str(args.batch)]

        def run(cmd):
            def go():
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
                assert proc.returncode == 0, proc.stderr[-3000:]
            return go

        rates = interleave({"ours": run(ours), "transformers": run(peer)}, args.rounds, args.questions)
        report(f"whole process, {args.questions} questions in {args.subjects} subjects, {shot}-shot, questions "
               f"~{args.question_tokens} tokens; {machine}; load average {os.getloadavg()[0]:.1f}", rates,
               "questions/s", CPU)


PEER_GENERATE_SCRIPT = r"""
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from ascend_engine.evaluate.answers import cut_at_stop
from ascend_engine.evaluate.tasks import load_task
torch.set_num_threads(int(sys.argv[3]) or torch.get_num_threads())
tok = AutoTokenizer.from_pretrained(sys.argv[1])
device, b, new = torch.device(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
hf = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32, attn_implementation="sdpa")
hf = hf.eval().to(device)
questions = load_task("gsm8k", sys.argv[2], 0)
rows = tok([q.prompt for q in questions])["input_ids"]
order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
out = [None] * len(rows)
with torch.inference_mode():
    for i in range(0, len(order), b):
        chunk = order[i: i + b]
        width = max(len(rows[j]) for j in chunk)
        ids = torch.tensor([[0] * (width - len(rows[j])) + rows[j] for j in chunk], device=device)
        mask = torch.tensor([[0] * (width - len(rows[j])) + [1] * len(rows[j]) for j in chunk], device=device)
        got = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False, use_cache=True,
                          eos_token_id=tok.eos_token_id, pad_token_id=0)
        for j, row in zip(chunk, got[:, width:].tolist()):
            row = row[: row.index(tok.eos_token_id) + 1] if tok.eos_token_id in row else row
            out[j] = cut_at_stop(tok.decode(row, skip_special_tokens=True), questions[j].stop)
print(json.dumps(out))
"""


def whole_process_generation(args, work: Path, words: int, machine: str) -> None:
    """``ascend-engine evaluate --task gsm8k`` against a transformers script generating for the same GSM8K-layout
    prompts (``--prompt-tokens`` random words each, 0-shot; greedy, up to ``--generate`` tokens, batches of
    ``--batch`` longest first); whole processes, start-up counted. The peer stops a row at the end-of-sequence
    token only and cuts the stop strings afterwards, sparing it the per-step check ours makes; the completions of
    both must be equal."""
    import random

    rng = random.Random(2)
    data = work / "gsm8k"
    data.mkdir(exist_ok=True)
    lines = []
    for _ in range(args.questions):
        n = rng.randint(int(args.prompt_tokens * 0.75), int(args.prompt_tokens * 1.25)) - 3  # "Question:", "Answer:"
        lines.append(json.dumps({"question": " ".join(f"w{rng.randrange(words)}" for _ in range(n)),
                                 "answer": f"w1 w2 #### {rng.randrange(100)}"}))
    (data / "test.jsonl").write_text("\n".join(lines) + "\n")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads or os.cpu_count())}
    results = work / "gsm8k-results.json"
    ours = [sys.executable, "-m", "ascend_engine.cli", "evaluate", "--device", args.device, "--task", "gsm8k",
            "--task-data-path", str(data), "--load", str(work / "mg"), "--tokenizer-name-or-path", str(work / "hf"),
            "--shot", "0", "--max-new-tokens", str(args.generate), "--evaluation-batch-size", str(args.batch),
            "--results-path", str(results)]
    peer = [sys.executable, "-c", PEER_GENERATE_SCRIPT, str(work / "hf"), str(data), str(args.threads),
            args.device, str(args.batch), str(args.generate)]
    outputs = {}

    def run(name, cmd):
        def go():
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            assert proc.returncode == 0, proc.stderr[-3000:]
            outputs[name] = proc.stdout
        return go

    variants = {"ours": run("ours", ours), "transformers": run("transformers", peer)}
    for go in variants.values():  # once before timing: the completions must agree
        go()
    theirs = json.loads(outputs["transformers"].strip().splitlines()[-1])
    mine = [row["completion"] for row in json.loads(results.read_text())["results"][0]["predictions"]]
    assert mine == theirs, "our completions differ from transformers'"
    print(f"  completions equal, {statistics.mean(len(c.split()) for c in mine):.1f} words on average", flush=True)
    rates = interleave(variants, args.rounds, args.questions)
    report(f"whole process, {args.questions} GSM8K-layout questions of ~{args.prompt_tokens} tokens, up to "
           f"{args.generate} new tokens each (greedy); {machine}; load average {os.getloadavg()[0]:.1f}", rates,
           "questions/s", CPU)


def generate_side_by_side(args, ours, hf, device, by_length) -> None:
    """Greedy generation for random prompts, ours against transformers' ``generate``: exactly ``args.generate``
    tokens each, or with ``args.varied_ends`` up to that many, each response ending at its first stop token."""
    import torch

    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(int(args.prompt_tokens * 0.75), int(args.prompt_tokens * 1.25) + 1, (args.questions,),
                            generator=gen)
    rows = [torch.randint(20, args.vocab_size, (int(n),), generator=gen).tolist() for n in lengths]
    b = args.batch
    stops: list[int] = []  # stop tokens (transformers' end-of-sequence list; ``finished`` for ours)

    def finished(_row, new):
        return new[-1] in stops

    def padded(chunk, left: bool):
        width = max(len(r) for r in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for j, r in enumerate(chunk):
            span = slice(width - len(r), width) if left else slice(0, len(r))
            ids[j, span], mask[j, span] = torch.tensor(r), 1
        return ids.to(device), mask.to(device)

    def generate_ours(questions=None):  # what generate_answers does: longest prompts first, ``b`` rows at once
        questions = questions or rows
        order = by_length(list(range(len(questions))), lambda i: len(questions[i]))
        out = [None] * len(questions)
        for j, new in zip(order, ours.generate([questions[j] for j in order], args.generate, None, finished,
                                               batch_size=b)):
            out[j] = new
        return out

    def generate_ours_batches(questions=None):  # before continuous batching: one batch after the other
        questions = questions or rows
        order = by_length(list(range(len(questions))), lambda i: len(questions[i]))
        out = [None] * len(questions)
        for i in range(0, len(order), b):
            chunk = order[i: i + b]
            for j, new in zip(chunk, ours.generate([questions[j] for j in chunk], args.generate, None, finished)):
                out[j] = new
        return out

    def generate_hf(questions=None):
        out = []
        with torch.inference_mode():
            for i in range(0, len(questions or rows), b):
                chunk = (questions or rows)[i: i + b]
                ids, mask = padded(chunk, left=True)
                new = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.generate,
                                  min_new_tokens=0 if stops else args.generate, do_sample=False, pad_token_id=0,
                                  use_cache=True, eos_token_id=stops or None)
                for row in new[:, ids.shape[1]:].tolist():  # up to its first stop token (then padding)
                    end = next((k + 1 for k, t in enumerate(row) if t in stops), len(row))
                    out.append(row[:end])
        return out

    hf.generation_config.eos_token_id = None
    if args.varied_ends:  # a stop token at a random point of each row's full response: responses end all along
        picks = torch.Generator().manual_seed(3)
        for new in generate_ours():
            stops.append(new[int(torch.randint(len(new), (1,), generator=picks))])
    got = generate_ours()
    assert got[:2 * b] == generate_hf(rows[:2 * b]), "our greedy tokens differ from transformers'"
    new_tokens = sum(len(r) for r in got)
    variants = {"ours": generate_ours, "transformers": generate_hf}
    if stops:
        variants["ours, batches"] = generate_ours_batches
        print(f"  responses of {min(map(len, got))}..{max(map(len, got))} tokens ({len(set(stops))} stop tokens), "
              f"{new_tokens} new tokens in all", flush=True)
    rates = interleave(variants, args.rounds, new_tokens)
    report(f"{args.questions} questions, ~{args.prompt_tokens} prompt tokens (+-25%), "
           f"{'up to ' if stops else ''}{args.generate} new tokens each (greedy), batch {b}, hidden "
           f"{args.hidden_size}, {args.num_layers} layers, vocab {args.vocab_size}, fp32, device {args.device}, "
           f"{torch.get_num_threads()} threads, {args.rounds} interleaved rounds; load average "
           f"{os.getloadavg()[0]:.1f}", rates, "new tokens/s", CPU)


if __name__ == "__main__":
    main()
