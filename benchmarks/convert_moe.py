"""Conversion of a tiny-but-wide mixture-of-experts model (Qwen3-MoE shape, 64 experts per layer).

Runs ``ascend-engine convert`` hf -> mg at EP4 (and mg EP4 -> hf) in child processes, interleaved with a plain
``shutil.copyfile`` of the same safetensors bytes, ``--repeat`` times (default 3), and prints the median and
spread of each, plus each conversion's peak RSS above the baseline of a process that only imports the converter,
next to the size of one layer's experts (what the converter's memory must stay near: it holds one tensor and its
shards at a time, never the model).

    .venv/bin/python benchmarks/convert_moe.py [--workdir DIR] [--layers 8] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

SHAPE = dict(vocab_size=8192, hidden_size=256, intermediate_size=512, moe_intermediate_size=256, num_experts=64,
             num_experts_per_tok=8, norm_topk_prob=True, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
             tie_word_embeddings=False, rope_theta=1000000.0, max_position_embeddings=4096)


def make_model(directory: Path, layers: int) -> tuple[int, int]:
    """config.json and one shard per layer, per-expert HF names; returns (parameters, bytes of one layer's experts)."""
    from transformers import AutoConfig

    directory.mkdir(parents=True)
    config = AutoConfig.for_model("qwen3_moe", num_hidden_layers=layers, architectures=["Qwen3MoeForCausalLM"],
                                  dtype="float32", **SHAPE)
    (directory / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
    h, f, d, e = SHAPE["hidden_size"], SHAPE["moe_intermediate_size"], SHAPE["head_dim"], SHAPE["num_experts"]
    q, kv = SHAPE["num_attention_heads"] * d, SHAPE["num_key_value_heads"] * d
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen) * 0.02

    shards = [{"model.embed_tokens.weight": rand(SHAPE["vocab_size"], h), "model.norm.weight": torch.ones(h),
               "lm_head.weight": rand(SHAPE["vocab_size"], h)}]
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors = {p + "input_layernorm.weight": torch.ones(h), p + "post_attention_layernorm.weight": torch.ones(h),
                   p + "self_attn.q_proj.weight": rand(q, h), p + "self_attn.k_proj.weight": rand(kv, h),
                   p + "self_attn.v_proj.weight": rand(kv, h), p + "self_attn.o_proj.weight": rand(h, q),
                   p + "self_attn.q_norm.weight": torch.ones(d), p + "self_attn.k_norm.weight": torch.ones(d),
                   p + "mlp.gate.weight": rand(e, h)}
        for j in range(e):
            x = f"{p}mlp.experts.{j}."
            tensors.update({x + "gate_proj.weight": rand(f, h), x + "up_proj.weight": rand(f, h),
                            x + "down_proj.weight": rand(h, f)})
        shards.append(tensors)
    weight_map, params = {}, 0
    for k, tensors in enumerate(shards):
        name = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(directory / name), metadata={"format": "pt"})
        weight_map.update({n: name for n in tensors})
        params += sum(t.numel() for t in tensors.values())
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return params, e * 3 * h * f * 4


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# One intra-op thread: conversion is copying, and on a shared, loaded machine torch's thread pool only contends
# (a 256x256 torch.cat measured 0.5 ms with one thread and 130 ms with two under a load average of 28).
CHILD_ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def timed_convert(*flags: str) -> tuple[float, int]:
    """Seconds and peak RSS (bytes) of one ``ascend-engine convert`` process."""
    cmd = [sys.executable, "-m", "ascend_engine.cli", "convert", *flags]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=CHILD_ENV)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"convert failed: {' '.join(cmd)}")
    return seconds, usage.ru_maxrss * 1024


def copy_bytes(src: Path, dst: Path) -> float:
    start = time.perf_counter()
    dst.mkdir()
    for f in src.glob("*.safetensors"):
        shutil.copyfile(f, dst / f.name)
    return time.perf_counter() - start


def summary(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f} (min {min(values):.2f}, max {max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", help="scratch folder (default: a temporary one, removed afterwards)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--make-only", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.make_only:
        print(*make_model(Path(opts.make_only), opts.layers))
        return
    work = Path(opts.workdir or tempfile.mkdtemp(prefix="convert-moe-bench-"))
    try:
        made = subprocess.run([sys.executable, __file__, "--make-only", str(work / "hf"), "--layers", str(opts.layers)],
                              check=True, capture_output=True, text=True)
        params, layer_experts = map(int, made.stdout.split()[-2:])
        size = folder_bytes(work / "hf")
        print(f"model: {params / 1e6:.0f}M parameters, {SHAPE['num_experts']} experts x {opts.layers} layers, "
              f"{size / 1e6:.0f} MB fp32 safetensors; one layer's experts: {layer_experts / 1e6:.1f} MB")
        # The interpreter with torch and the converter imported, converting nothing: the floor of every peak RSS.
        _, floor = timed_convert("--help")
        print(f"baseline peak RSS (imports, no conversion): {floor / 1e6:.0f} MB")
        runs: dict[str, list[float]] = {"copyfile": [], "hf -> mg EP4": [], "mg EP4 -> hf": []}
        rss: dict[str, list[int]] = {"hf -> mg EP4": [], "mg EP4 -> hf": []}
        for _ in range(opts.repeat):  # interleaved, so load from other processes hits every variant alike
            runs["copyfile"].append(copy_bytes(work / "hf", work / "copy"))
            shutil.rmtree(work / "copy")
            s, r = timed_convert("--load-dir", str(work / "hf"), "--save-dir", str(work / "mg"),
                                 "--target-expert-parallel-size", "4", "--make-vocab-size-divisible-by", "1")
            runs["hf -> mg EP4"].append(s)
            rss["hf -> mg EP4"].append(r)
            s, r = timed_convert("--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", str(work / "mg"),
                                 "--save-dir", str(work / "hf2"), "--model-type-hf", "qwen3_moe")
            runs["mg EP4 -> hf"].append(s)
            rss["mg EP4 -> hf"].append(r)
            shutil.rmtree(work / "mg")
            shutil.rmtree(work / "hf2")
        copy = statistics.median(runs["copyfile"])
        for name, seconds in runs.items():
            line = f"{name}: {summary(seconds)} s, {size / 1e6 / statistics.median(seconds):.0f} MB/s"
            if name in rss:
                peak = statistics.median(rss[name])
                line += (f", {statistics.median(seconds) / copy:.1f}x copyfile; peak RSS {peak / 1e6:.0f} MB, "
                         f"{(peak - floor) / 1e6:.0f} MB above the baseline = {(peak - floor) / layer_experts:.1f}x "
                         f"one layer's experts ({100 * (peak - floor) / size:.0f}% of the model)")
            print(line)
    finally:
        if not opts.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
