"""Evaluation speed, ours vs transformers on the same model: choice-task scoring (questions/s at batch 1 and 16)
or, with ``--generate N``, greedy generation of N new tokens per question (generative tasks' path).

A random Qwen3-shaped HF model is saved, converted to a Megatron checkpoint with our converter and loaded the way
``ascend-engine evaluate`` loads it; each question is a random prompt of ``--prompt-tokens`` tokens whose four
answer letters are scored from one forward pass (``InferenceModel.next_token_logprobs``). The peer is
``transformers``' forward on the same weights and rows (right-padded, last real position's log-softmax).
With ``--generate N`` each question is continued greedily by exactly N tokens (no end-of-sequence) with
``InferenceModel.generate`` (KV cache, batched) at batch 1 and 16, against transformers' ``generate`` with its
cache, one question at a time (its batch needs left padding, which shifts positions); the first question's
tokens must agree. Rounds interleave the four variants so drift in machine load hits all alike; median and
spread are printed.

    python benchmarks/evaluate.py [--device cpu|cuda] [--questions 32 --prompt-tokens 256 --rounds 3]
    python benchmarks/evaluate.py --generate 64 --questions 16 --prompt-tokens 128
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
    ap.add_argument("--hidden-size", type=int, default=256)
    ap.add_argument("--num-layers", type=int, default=4)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=256, help="mean prompt length (+-25%%)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--generate", type=int, default=0, metavar="N", help="benchmark generation of N new tokens")
    args = ap.parse_args()
    for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"):
        os.environ.pop(k, None)

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ascend_engine.cli import main as engine
    from ascend_engine.device import select_backend
    from ascend_engine.evaluate.model import InferenceModel
    from ascend_engine.generate.loading import load_model, read_args
    from ascend_engine.parallel import destroy_parallel, init_parallel

    work = tempfile.mkdtemp(prefix="bench-eval-")
    config = AutoConfig.for_model("qwen3", vocab_size=args.vocab_size, hidden_size=args.hidden_size,
                                  intermediate_size=args.hidden_size * 3, num_hidden_layers=args.num_layers,
                                  num_attention_heads=8, num_key_value_heads=4, head_dim=args.hidden_size // 8,
                                  max_position_embeddings=4096, tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    hf.save_pretrained(f"{work}/hf")
    assert engine(["convert", "--load-dir", f"{work}/hf", "--save-dir", f"{work}/mg"]) == 0
    backend = select_backend(args.device)
    backend.apply()
    info = init_parallel(backend, 1, 1, seed=0)
    iteration, ckpt_args = read_args(f"{work}/mg")
    model_cfg, gpt, max_len = load_model(f"{work}/mg", iteration, ckpt_args, 0, 0, backend.torch_device)
    ours = InferenceModel(gpt, model_cfg.vocabSize, max_len, info, backend.torch_device)
    hf.to(backend.torch_device)

    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(int(args.prompt_tokens * 0.75), int(args.prompt_tokens * 1.25) + 1, (args.questions,),
                            generator=gen)
    rows = [torch.randint(0, args.vocab_size, (int(n),), generator=gen).tolist() for n in lengths]
    letters = [[10, 11, 12, 13]] * len(rows)

    def run_ours(batch):
        for i in range(0, len(rows), batch):
            ours.next_token_logprobs(rows[i: i + batch], letters[i: i + batch])

    def run_hf(batch):
        with torch.no_grad():
            for i in range(0, len(rows), batch):
                chunk = rows[i: i + batch]
                width = max(len(r) for r in chunk)
                ids = torch.zeros(len(chunk), width, dtype=torch.long)
                for j, r in enumerate(chunk):
                    ids[j, : len(r)] = torch.tensor(r)
                logits = hf(ids.to(backend.torch_device)).logits
                for j, r in enumerate(chunk):
                    torch.log_softmax(logits[j, len(r) - 1].float(), -1)[letters[i + j]].tolist()

    def generate_ours(batch, questions=None):
        questions = questions or rows
        out = []
        for i in range(0, len(questions), batch):
            out += ours.generate(questions[i: i + batch], args.generate, eos_id=None)
        return out

    def generate_hf(batch, questions=None):
        out = []
        with torch.no_grad():
            for r in questions or rows:
                ids = torch.tensor([r], device=backend.torch_device)
                new = hf.generate(ids, max_new_tokens=args.generate, min_new_tokens=args.generate, do_sample=False,
                                  pad_token_id=0)
                out.append(new[0, len(r):].tolist())
        return out

    if args.generate:
        run_ours, run_hf = generate_ours, generate_hf
        hf.generation_config.eos_token_id = None
        assert generate_ours(1, rows[:1]) == generate_hf(1, rows[:1]), "our greedy tokens differ from transformers'"
    variants = {f"{name} batch {b}": (fn, b) for b in (1, 16) for name, fn in (("ours", run_ours), ("hf", run_hf))
                if not (args.generate and name == "hf" and b == 16)}
    run_ours(16), run_hf(16)  # warm-up
    rates: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for key, (fn, b) in variants.items():
            start = time.perf_counter()
            fn(b)
            rates[key].append(len(rows) / (time.perf_counter() - start))
    destroy_parallel()
    shutil.rmtree(work, ignore_errors=True)
    print(f"{args.questions} questions, ~{args.prompt_tokens} prompt tokens, hidden {args.hidden_size}, "
          f"{args.num_layers} layers, vocab {args.vocab_size}, device {args.device}, {args.rounds} rounds"
          + (f", {args.generate} new tokens each" if args.generate else ""))
    for key, values in rates.items():
        print(f"{key:<14} {statistics.median(values):8.2f} questions/s  (min {min(values):.2f}, max {max(values):.2f})")
    for b in (1, 16):
        peer = "hf batch 1" if args.generate else f"hf batch {b}"
        ratio = statistics.median(rates[f"ours batch {b}"]) / statistics.median(rates[peer])
        print(f"ours batch {b} / transformers {peer.removeprefix('hf ')} = {ratio:.2f}")


if __name__ == "__main__":
    main()
