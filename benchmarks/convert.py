"""Checkpoint conversion throughput on a random ~1B-parameter Qwen3-shaped model made on the spot.

Prints seconds, MB/s and peak RSS of ``ascend-engine convert`` hf -> mg (TP2 PP2) and back, next to the time
``shutil.copyfile`` takes for the same bytes. Each conversion runs in its own process so its peak RSS is its own.

    .venv/bin/python benchmarks/convert.py [--workdir DIR] [--layers 14]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

# Qwen3-1.7B's width with half its depth: ~1.0B parameters (tied embeddings).
SHAPE = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_attention_heads=16,
             num_key_value_heads=8, head_dim=128, tie_word_embeddings=True, rope_theta=1000000.0,
             max_position_embeddings=4096)


def make_model(directory: Path, layers: int) -> int:
    """Write config.json and one safetensors shard per layer (never the whole model in memory); returns params."""
    from transformers import Qwen3Config

    directory.mkdir(parents=True)
    config = Qwen3Config(num_hidden_layers=layers, architectures=["Qwen3ForCausalLM"], dtype="float32", **SHAPE)
    (directory / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
    h, f, d = SHAPE["hidden_size"], SHAPE["intermediate_size"], SHAPE["head_dim"]
    q, kv = SHAPE["num_attention_heads"] * d, SHAPE["num_key_value_heads"] * d
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen) * 0.02

    groups = [{"model.embed_tokens.weight": rand(SHAPE["vocab_size"], h), "model.norm.weight": torch.ones(h)}]
    weight_map, params = {}, 0
    for i in range(layers + 1):
        if i < layers:
            p = f"model.layers.{i}."
            groups.append({p + "input_layernorm.weight": torch.ones(h), p + "post_attention_layernorm.weight": torch.ones(h),
                           p + "self_attn.q_proj.weight": rand(q, h), p + "self_attn.k_proj.weight": rand(kv, h),
                           p + "self_attn.v_proj.weight": rand(kv, h), p + "self_attn.o_proj.weight": rand(h, q),
                           p + "self_attn.q_norm.weight": torch.ones(d), p + "self_attn.k_norm.weight": torch.ones(d),
                           p + "mlp.gate_proj.weight": rand(f, h), p + "mlp.up_proj.weight": rand(f, h),
                           p + "mlp.down_proj.weight": rand(h, f)})
        tensors = groups.pop(0)
        name = f"model-{i + 1:05d}-of-{layers + 1:05d}.safetensors"
        save_file(tensors, str(directory / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in tensors})
        params += sum(t.numel() for t in tensors.values())
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return params


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def timed_convert(*flags: str) -> tuple[float, int]:
    """Seconds and peak RSS (bytes) of one ``ascend-engine convert`` process."""
    cmd = [sys.executable, "-m", "ascend_engine.cli", "convert", *flags]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"convert failed: {' '.join(cmd)}")
    return seconds, usage.ru_maxrss * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", help="scratch folder (default: a temporary one, removed afterwards)")
    parser.add_argument("--layers", type=int, default=14)
    parser.add_argument("--make-only", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.make_only:
        print(make_model(Path(opts.make_only), opts.layers))
        return
    work = Path(opts.workdir or tempfile.mkdtemp(prefix="convert-bench-"))
    try:
        t0 = time.perf_counter()
        # Made in a child: a child's peak RSS starts from its parent's at fork, so this process stays small.
        made = subprocess.run([sys.executable, __file__, "--make-only", str(work / "hf"), "--layers", str(opts.layers)],
                              check=True, capture_output=True, text=True)
        params = int(made.stdout.split()[-1])
        size = folder_bytes(work / "hf")
        print(f"model: {params / 1e9:.2f}B parameters, {size / 1e9:.2f} GB fp32 safetensors "
              f"(made in {time.perf_counter() - t0:.0f} s)")

        t0 = time.perf_counter()
        (work / "copy").mkdir()
        for f in (work / "hf").glob("*.safetensors"):
            shutil.copyfile(f, work / "copy" / f.name)
        copy_s = time.perf_counter() - t0
        print(f"shutil.copyfile of the same shards: {copy_s:.1f} s, {size / 1e6 / copy_s:.0f} MB/s")
        shutil.rmtree(work / "copy")

        rows = []
        s, rss = timed_convert("--load-model-type", "hf", "--save-model-type", "mg", "--load-dir", str(work / "hf"),
                               "--save-dir", str(work / "mg"), "--target-tensor-parallel-size", "2",
                               "--target-pipeline-parallel-size", "2", "--make-vocab-size-divisible-by", "1")
        rows.append(("hf -> mg TP2 PP2", s, folder_bytes(work / "mg"), rss))
        s, rss = timed_convert("--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", str(work / "mg"),
                               "--save-dir", str(work / "hf2"), "--model-type-hf", "qwen3")
        rows.append(("mg TP2 PP2 -> hf", s, folder_bytes(work / "hf2"), rss))
        for what, seconds, written, rss in rows:
            print(f"{what}: {seconds:.1f} s, {written / 1e6 / seconds:.0f} MB/s written "
                  f"({written / 1e9:.2f} GB; copyfile: {copy_s:.1f} s), peak RSS {rss / 1e9:.2f} GB "
                  f"({100 * rss / size:.0f}% of the model)")
    finally:
        if not opts.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
