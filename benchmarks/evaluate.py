"""Evaluation speed, ours vs transformers on the same model, side by side at the same batch sizes: choice-task
scoring (questions/s) or, with ``--generate N``, greedy generation of N new tokens per question (new tokens/s).

A random Qwen3-shaped HF model is saved, converted to a Megatron checkpoint with our converter and loaded the way
``ascend-engine evaluate`` loads it; each question is a random prompt of ``--prompt-tokens`` tokens (+-25%) whose
four answer letters are scored from one forward pass, through ``score_choices`` (the evaluation's own batching).
The peer is ``transformers`` at its best settings: sdpa attention, ``inference_mode``, batched with an attention
mask (right padding for scoring, the last real position's log-softmax; left padding for ``generate``, with its KV
cache). With ``--generate N`` each question is continued greedily by exactly N tokens (no end-of-sequence) through
``generate_answers``; the first batch's tokens must agree with transformers'. Rounds interleave the variants so
drift in machine load hits all alike; median and spread of the rates and of the per-round ratios are printed.

    python benchmarks/evaluate.py [--device cpu|cuda] [--questions 256 --prompt-tokens 200 --batch 16 --rounds 3]
    python benchmarks/evaluate.py --generate 128 --questions 16 --prompt-tokens 200 --batch 16
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "npu"])
    ap.add_argument("--hidden-size", type=int, default=512)
    ap.add_argument("--num-layers", type=int, default=8)
    ap.add_argument("--vocab-size", type=int, default=32000)
    ap.add_argument("--questions", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=200, help="mean prompt length (+-25%%)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads for both (0: torch's default)")
    ap.add_argument("--generate", type=int, default=0, metavar="N", help="benchmark generation of N new tokens")
    args = ap.parse_args()
    for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"):
        os.environ.pop(k, None)

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ascend_engine.cli import main as engine
    from ascend_engine.device import select_backend
    from ascend_engine.evaluate.model import InferenceModel
    from ascend_engine.evaluate.scoring import by_length
    from ascend_engine.generate.loading import load_model, read_args
    from ascend_engine.parallel import destroy_parallel, init_parallel

    if args.threads:
        torch.set_num_threads(args.threads)
    work = tempfile.mkdtemp(prefix="bench-eval-")
    config = AutoConfig.for_model("qwen3", vocab_size=args.vocab_size, hidden_size=args.hidden_size,
                                  intermediate_size=args.hidden_size * 3, num_hidden_layers=args.num_layers,
                                  num_attention_heads=8, num_key_value_heads=4, head_dim=args.hidden_size // 8,
                                  max_position_embeddings=4096, tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa").eval()
    hf.save_pretrained(f"{work}/hf")
    assert engine(["convert", "--load-dir", f"{work}/hf", "--save-dir", f"{work}/mg"]) == 0
    backend = select_backend(args.device)
    backend.apply()
    info = init_parallel(backend, 1, 1, seed=0)
    iteration, ckpt_args = read_args(f"{work}/mg")
    model_cfg, gpt, max_len = load_model(f"{work}/mg", iteration, ckpt_args, 0, 0, backend.torch_device)
    ours = InferenceModel(gpt, model_cfg.vocabSize, max_len, info, backend.torch_device)
    hf.to(backend.torch_device)
    device = backend.torch_device

    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(int(args.prompt_tokens * 0.75), int(args.prompt_tokens * 1.25) + 1, (args.questions,),
                            generator=gen)
    rows = [torch.randint(20, args.vocab_size, (int(n),), generator=gen).tolist() for n in lengths]
    letters = [10, 11, 12, 13]
    b = args.batch

    def score_ours(questions=None):
        questions = questions or rows
        order = by_length(list(range(len(questions))), lambda i: len(questions[i]))  # what score_choices does
        for i in range(0, len(order), b):
            chunk = order[i: i + b]
            ours.next_token_logprobs([questions[j] for j in chunk], [letters] * len(chunk))

    def padded(chunk, left: bool):
        width = max(len(r) for r in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for j, r in enumerate(chunk):
            span = slice(width - len(r), width) if left else slice(0, len(r))
            ids[j, span], mask[j, span] = torch.tensor(r), 1
        return ids.to(device), mask.to(device)

    def score_hf(questions=None):
        questions = questions or rows
        with torch.inference_mode():
            for i in range(0, len(questions), b):
                chunk = questions[i: i + b]
                ids, mask = padded(chunk, left=False)
                logits = hf(input_ids=ids, attention_mask=mask).logits
                for j, r in enumerate(chunk):
                    torch.log_softmax(logits[j, len(r) - 1].float(), -1)[letters].tolist()

    def generate_ours(questions=None):
        questions = questions or rows
        order = by_length(list(range(len(questions))), lambda i: len(questions[i]))  # what generate_answers does
        out = [None] * len(questions)
        for i in range(0, len(order), b):
            chunk = order[i: i + b]
            for j, new in zip(chunk, ours.generate([questions[j] for j in chunk], args.generate, eos_id=None)):
                out[j] = new
        return out

    def generate_hf(questions=None):
        out = []
        with torch.inference_mode():
            for i in range(0, len(questions or rows), b):
                chunk = (questions or rows)[i: i + b]
                ids, mask = padded(chunk, left=True)
                new = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.generate,
                                  min_new_tokens=args.generate, do_sample=False, pad_token_id=0, use_cache=True)
                out += new[:, ids.shape[1]:].tolist()
        return out

    if args.generate:
        hf.generation_config.eos_token_id = None
        first = rows[:b]
        assert generate_ours(first) == generate_hf(first), "our greedy tokens differ from transformers'"
        variants = {"ours": generate_ours, "transformers": generate_hf}
        unit, amount = "new tokens/s", len(rows) * args.generate
    else:
        variants = {"ours": score_ours, "transformers": score_hf}
        unit, amount = "questions/s", len(rows)
    for fn in variants.values():  # warm-up: one batch each
        fn(rows[:b])
    rates: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for key, fn in variants.items():
            start = time.perf_counter()
            fn()
            rates[key].append(amount / (time.perf_counter() - start))
    destroy_parallel()
    shutil.rmtree(work, ignore_errors=True)
    print(f"{args.questions} questions, ~{args.prompt_tokens} prompt tokens (+-25%), batch {b}, hidden "
          f"{args.hidden_size}, {args.num_layers} layers, vocab {args.vocab_size}, fp32, device {args.device}, "
          f"{torch.get_num_threads()} threads, {args.rounds} interleaved rounds"
          + (f", {args.generate} new tokens each (greedy)" if args.generate else " (choice scoring)")
          + f"; load average {os.getloadavg()[0]:.1f}")
    for key, values in rates.items():
        print(f"{key:<13} {statistics.median(values):9.2f} {unit}  (min {min(values):.2f}, max {max(values):.2f})")
    ratios = [o / t for o, t in zip(rates["ours"], rates["transformers"])]
    print(f"ours / transformers per round: median {statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f})")


if __name__ == "__main__":
    main()
