"""Rollout throughput of ``generate.batched``: new tokens per second with megatron-core's KV cache and without it,
next to HuggingFace ``transformers`` ``generate`` (with and without its cache) on a model of the same shape.

A random Llama-shaped model (RoPE, SwiGLU, RMSNorm; one process, TP1) continues a batch of random prompts by
exactly ``--new-tokens`` tokens (no end-of-sequence), greedily. The four variants run interleaved ``--repeats``
times; the script prints the median and the spread (min..max) of tokens/s and checks that the cached and uncached
runs of our engine produced the same tokens. Without a cache the cost of token t grows with t, so the ratio grows
with ``--new-tokens``.

    .venv/bin/python benchmarks/generate.py [--layers 4 --hidden 256 --batch 8 --prompt 32 --new-tokens 96]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def build(args):
    from ascend_engine.config.train import ModelConfig, ParallelConfig
    from ascend_engine.device import select_backend
    from ascend_engine.models.gpt import build_gpt_model
    from ascend_engine.parallel import init_parallel

    backend = select_backend("cpu")
    init_parallel(backend, 1, 1, seed=0)
    max_len = args.prompt + args.new_tokens
    model = ModelConfig(numLayers=args.layers, hiddenSize=args.hidden, numAttentionHeads=args.hidden // 64,
                        vocabSize=args.vocab, paddedVocabSize=args.vocab, maxPositionEmbeddings=max_len,
                        positionEmbeddingType="rope", normalization="RMSNorm", swiglu=True,
                        untieEmbeddingsAndOutputWeights=True)
    gpt = build_gpt_model(model, ParallelConfig(), max_len, seed=1).eval()
    return gpt, model, max_len


def build_hf(args, model):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=model.ffn_hidden_size,
                         num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                         num_key_value_heads=args.hidden // 64, max_position_embeddings=args.prompt + args.new_tokens)
    return LlamaForCausalLM(config).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the machine is shared)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from ascend_engine.generate.batched import generate_batch
    from ascend_engine.parallel import destroy_parallel

    gpt, model, max_len = build(args)
    hf = build_hf(args, model)
    prompts = torch.randint(4, args.vocab, (args.batch, args.prompt), generator=torch.Generator().manual_seed(2))
    new = args.batch * args.new_tokens

    def ours(cache: bool):
        return generate_batch(gpt, prompts.tolist(), max_new_tokens=args.new_tokens, eos_id=None,
                              vocab_size=args.vocab, max_length=max_len, use_cache=cache).tokens

    def peer(cache: bool):
        with torch.no_grad():
            return hf.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=args.new_tokens,
                               min_new_tokens=args.new_tokens, do_sample=False, use_cache=cache, pad_token_id=0)

    variants = {"ascend-engine, KV cache": lambda: ours(True), "ascend-engine, no cache": lambda: ours(False),
                "transformers generate, cache": lambda: peer(True),
                "transformers generate, no cache": lambda: peer(False)}
    rates: dict[str, list[float]] = {k: [] for k in variants}
    outputs = {}
    for _ in range(args.repeats):
        for name, fn in variants.items():
            start = time.perf_counter()
            outputs[name] = fn()
            rates[name].append(new / (time.perf_counter() - start))
    same = torch.equal(outputs["ascend-engine, KV cache"], outputs["ascend-engine, no cache"])
    print(f"model: {args.layers} layers, hidden {args.hidden}, vocab {args.vocab}; batch {args.batch} x prompt "
          f"{args.prompt} + {args.new_tokens} new tokens; {args.threads} thread(s), {args.repeats} interleaved repeats")
    for name, r in rates.items():
        print(f"{name:34s} {statistics.median(r):9.1f} new tokens/s  (spread {min(r):.1f} .. {max(r):.1f})")
    cached, uncached = (statistics.median(rates[k]) for k in ("ascend-engine, KV cache", "ascend-engine, no cache"))
    hf_cached = statistics.median(rates["transformers generate, cache"])
    print(f"KV cache speed-up {cached / uncached:.2f}x; ascend-engine / transformers (both cached) "
          f"{cached / hf_cached:.2f}x; cached and uncached tokens identical: {same}")
    destroy_parallel()
    if not same:
        raise SystemExit("cached and uncached generation differ")


if __name__ == "__main__":
    main()
