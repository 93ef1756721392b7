"""Rollout throughput of ``generate.batched``: new tokens per second with megatron-core's KV cache and without it,
next to HuggingFace ``transformers`` ``generate`` (with and without its cache) on a model of the same shape.

A random Llama-shaped model (RoPE, SwiGLU, RMSNorm; one process, TP1) continues a batch of random prompts by
exactly ``--new-tokens`` tokens (no end-of-sequence), greedily. Prompts are ``--prompt`` tokens long, or with
``--spread f`` of mixed lengths drawn from prompt x (1 +- f); transformers gets them left-padded with an attention
mask, ``sdpa`` attention, under ``inference_mode`` (its best settings), ours as they are. On CUDA ours also runs
with its decode step eager (no captured graphs), and the two are compared. The variants run
interleaved ``--repeats`` times; the script prints the median and the spread (min..max) of new tokens per second
of wall time and per second of process CPU time (on a machine shared with other work the CPU time is the steadier
of the two: it does not count the time the process waited for a core), the per-round ratio of ours to
transformers, and checks that the cached and uncached runs of our engine produced the same tokens. Without a cache
the cost of token t grows with t, so that ratio grows with ``--new-tokens``; ``--no-uncached`` leaves those
variants out.

    .venv/bin/python benchmarks/generate.py [--layers 4 --hidden 256 --batch 8 --prompt 32 --new-tokens 96]
    .venv/bin/python benchmarks/generate.py --layers 8 --hidden 512 --vocab 32000 --batch 16 --prompt 200 \
        --spread 0.25 --new-tokens 128 --no-uncached
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def longest(args) -> int:
    return int(args.prompt * (1 + args.spread))


def build(args):
    from ascend_engine.config.train import ModelConfig, ParallelConfig
    from ascend_engine.device import select_backend
    from ascend_engine.models.gpt import build_gpt_model
    from ascend_engine.parallel import init_parallel

    backend = select_backend(args.device)
    backend.apply()
    init_parallel(backend, 1, 1, seed=0)
    max_len = longest(args) + args.new_tokens
    model = ModelConfig(numLayers=args.layers, hiddenSize=args.hidden, numAttentionHeads=args.hidden // 64,
                        vocabSize=args.vocab, paddedVocabSize=args.vocab, maxPositionEmbeddings=max_len,
                        positionEmbeddingType="rope", normalization="RMSNorm", swiglu=True,
                        untieEmbeddingsAndOutputWeights=True)
    gpt = build_gpt_model(model, ParallelConfig(), max_len, seed=1).to(backend.torch_device).eval()
    return gpt, model, max_len, backend.torch_device


def build_hf(args, model):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=model.ffn_hidden_size,
                         num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                         num_key_value_heads=args.hidden // 64,
                         max_position_embeddings=longest(args) + args.new_tokens, attn_implementation="sdpa")
    return LlamaForCausalLM(config).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--spread", type=float, default=0.0, help="prompt lengths prompt x (1 +- spread)")
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--no-uncached", action="store_true", help="leave out the variants without a KV cache")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the machine is shared)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "npu"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from ascend_engine.generate.batched import generate_batch
    from ascend_engine.parallel import destroy_parallel

    gpt, model, max_len, device = build(args)
    hf = build_hf(args, model).to(device)
    gen = torch.Generator().manual_seed(2)
    low, high = int(args.prompt * (1 - args.spread)), longest(args)
    lengths = torch.randint(low, high + 1, (args.batch,), generator=gen).tolist()
    prompts = [torch.randint(4, args.vocab, (n,), generator=gen).tolist() for n in lengths]
    ids = torch.zeros(args.batch, high, dtype=torch.long)  # left-padded for transformers
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, high - len(p):], mask[i, high - len(p):] = torch.tensor(p), 1
    ids, mask = ids.to(device), mask.to(device)
    new = args.batch * args.new_tokens

    def ours(cache: bool):
        return generate_batch(gpt, prompts, max_new_tokens=args.new_tokens, eos_id=None,
                              vocab_size=args.vocab, max_length=max_len, use_cache=cache).tokens

    def peer(cache: bool):
        with torch.inference_mode():
            return hf.generate(ids, attention_mask=mask, max_new_tokens=args.new_tokens,
                               min_new_tokens=args.new_tokens, do_sample=False, use_cache=cache, pad_token_id=0)

    def ours_eager():  # the decode step run kernel by kernel, not replayed from captured graphs
        from unittest import mock

        import ascend_engine.device

        with mock.patch.object(ascend_engine.device, "step_graphs", lambda device: None):
            return ours(True)

    variants = {"ascend-engine, KV cache": lambda: ours(True), "transformers generate, cache": lambda: peer(True)}
    if device.type == "cuda":
        variants["ascend-engine, cache, eager"] = ours_eager
    if not args.no_uncached:
        variants |= {"ascend-engine, no cache": lambda: ours(False),
                     "transformers generate, no cache": lambda: peer(False)}
    wall: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    outputs = {}
    for _ in range(args.repeats):
        for name, fn in variants.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            outputs[name] = fn()
            if device.type != "cpu":
                torch.cuda.synchronize()  # npu: torch_npu maps torch.cuda onto the NPU
            wall[name].append(new / (time.perf_counter() - start))
            cpu[name].append(new / (time.process_time() - start_cpu))
    print(f"model: {args.layers} layers, hidden {args.hidden}, vocab {args.vocab}; batch {args.batch} x prompt "
          f"{low}..{high} + {args.new_tokens} new tokens; fp32 on {device}, {args.threads} thread(s), "
          f"{args.repeats} interleaved "
          f"repeats; load average {os.getloadavg()[0]:.1f}")
    for name in variants:
        print(f"{name:31s} {statistics.median(wall[name]):8.1f} new tokens/s (spread {min(wall[name]):.1f} .. "
              f"{max(wall[name]):.1f}); per CPU second {statistics.median(cpu[name]):.1f} "
              f"({min(cpu[name]):.1f} .. {max(cpu[name]):.1f})")
    for label, rates in (("wall", wall), ("CPU", cpu)):
        ratios = [o / t for o, t in zip(rates["ascend-engine, KV cache"], rates["transformers generate, cache"])]
        print(f"ascend-engine / transformers (both cached), {label} time, per round: median "
              f"{statistics.median(ratios):.2f}x (min {min(ratios):.2f}, max {max(ratios):.2f})")
    destroy_parallel()
    if "ascend-engine, cache, eager" in outputs:
        graphed, eager = (outputs[k].cpu() for k in ("ascend-engine, KV cache", "ascend-engine, cache, eager"))
        rows = int((graphed != eager).any(dim=1).sum())
        speed = (statistics.median(wall["ascend-engine, KV cache"])
                 / statistics.median(wall["ascend-engine, cache, eager"]))
        print(f"captured graphs {speed:.2f}x the eager decode step; rows whose tokens differ: {rows} of {len(prompts)}")
    if not args.no_uncached:
        cached, uncached = (statistics.median(wall[k]) for k in ("ascend-engine, KV cache", "ascend-engine, no cache"))
        same = torch.equal(outputs["ascend-engine, KV cache"].cpu(), outputs["ascend-engine, no cache"].cpu())
        print(f"KV cache speed-up {cached / uncached:.2f}x; cached and uncached tokens identical: {same}")
        if not same:
            raise SystemExit("cached and uncached generation differ")


if __name__ == "__main__":
    main()
