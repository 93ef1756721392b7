"""HF -> Megatron-core conversion against a plain copy of the same files and against Megatron-LM's converter.

A random TinyLlama-shaped bf16 model (hidden 2048, 32 heads, 4 query groups, ffn 5632, vocab 32000, untied
output) is made on the spot: 10 layers are 1.14 GB, 110 layers 9.95 GB (``--layers``; a ``--workdir`` keeps it
for the next run). Then, interleaved for ``--rounds`` rounds, each contender in its own process (so its peak RSS
is its own):

- ``cp -r`` of the HF folder (the physical limit: read and write the same bytes once);
- ``ascend-engine convert`` hf -> mg at TP1 PP1 and at TP2 PP2;
- with ``--megatron-lm PATH`` (a checkout of Megatron-LM core_v0.12.1): its ``tools/checkpoint/convert.py
  --loader llama_mistral --saver core`` at the same layouts.

Prints median and spread of the wall seconds, the median of the per-round ratios to ``cp -r``, and peak RSS.
The page cache is warm for every contender alike (the source is read once before the first round).

    .venv/bin/python benchmarks/convert.py [--layers 10] [--rounds 3] [--megatron-lm /tmp/megatron-lm]

Megatron-LM on CPU: its converter runs from a temporary copy of ``tools/checkpoint`` (plus ``pretrain_gpt.py``)
with these patches applied at run time (nothing of Megatron is kept in this repository); each is checked to
apply, so a different Megatron version fails loudly instead of being measured wrongly:

1. ``saver_base.py``: skip the TransformerEngine version check (no TE on CPU; the local spec is used);
2. ``loader_llama_mistral.py``: compare the transformers version as a tuple (it rejects transformers 5.x);
3. both: skip ``fused_kernels.load`` (it compiles CUDA kernels);
4. loader: ``from_pretrained`` without ``low_cpu_mem_usage=True, device_map="cpu"`` (transformers 5 wants
   ``accelerate`` for a device map; CPU is its default anyway);
5. both: add ``--no-rope-fusion --no-gradient-accumulation-fusion`` to the Megatron arguments they build
   (those fusions need TE/Apex);
6. the whole converter runs under this project's CPU shim (``ascend_engine.device``, the same idea as
   ``torch_npu``'s ``transfer_to_npu``): Megatron's legacy model asks ``torch.cuda.current_device()``.
The peer also imports ``six``, ``einops`` and ``psutil``: ``.venv/bin/pip install six einops psutil`` first.
It is told the true vocabulary size (``--true-vocab-size``), so it writes the same 32000 embedding rows.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sidebyside import Contender, interleave, table  # noqa: E402

# TinyLlama-1.1B's width; its 22 layers cut to --layers.
SHAPE = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_attention_heads=32,
             num_key_value_heads=4, tie_word_embeddings=False, rope_theta=10000.0, max_position_embeddings=4096,
             rms_norm_eps=1e-5)
LAYOUTS = ((1, 1), (2, 2))


def make_model(directory: Path, layers: int) -> int:
    """config.json, one bf16 safetensors shard per layer (never the whole model in memory), a tokenizer; returns
    the parameter count."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    directory.mkdir(parents=True)
    config = LlamaConfig(num_hidden_layers=layers, architectures=["LlamaForCausalLM"], dtype="bfloat16", **SHAPE)
    (directory / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
    h, f = SHAPE["hidden_size"], SHAPE["intermediate_size"]
    kv = SHAPE["num_key_value_heads"] * h // SHAPE["num_attention_heads"]
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)

    groups = [{"model.embed_tokens.weight": rand(SHAPE["vocab_size"], h), "model.norm.weight": ones(h),
               "lm_head.weight": rand(SHAPE["vocab_size"], h)}]
    weight_map, params = {}, 0
    for i in range(layers + 1):
        if i < layers:
            p = f"model.layers.{i}."
            groups.append({p + "input_layernorm.weight": ones(h), p + "post_attention_layernorm.weight": ones(h),
                           p + "self_attn.q_proj.weight": rand(h, h), p + "self_attn.k_proj.weight": rand(kv, h),
                           p + "self_attn.v_proj.weight": rand(kv, h), p + "self_attn.o_proj.weight": rand(h, h),
                           p + "mlp.gate_proj.weight": rand(f, h), p + "mlp.up_proj.weight": rand(f, h),
                           p + "mlp.down_proj.weight": rand(h, f)})
        tensors = groups.pop(0)
        name = f"model-{i + 1:05d}-of-{layers + 1:05d}.safetensors"
        save_file(tensors, str(directory / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in tensors})
        params += sum(t.numel() for t in tensors.values())
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    _tokenizer(directory)
    return params


def _tokenizer(directory: Path) -> None:
    """A small byte-level BPE with Llama-3's special tokens: the peer's llama3 loader wants an HF tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["conversion at the speed of the disk"] * 10, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>",
                            eos_token="<|end_of_text|>").save_pretrained(directory)


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


_PATCHES = {  # file -> [(text, replacement)], see the module docstring
    "saver_base.py": [
        ('te_version = PkgVersion(version("transformer-engine"))', 'te_version = PkgVersion("0.12.0")'),
        ("        fused_kernels.load(self.margs)", "        pass"),
        ("'--no-bias-dropout-fusion',",
         "'--no-bias-dropout-fusion', '--no-rope-fusion', '--no-gradient-accumulation-fusion',")],
    "loader_llama_mistral.py": [
        ("assert major >= 4 and minor >= 31", "assert (major, minor) >= (4, 31)"),
        ("    fused_kernels.load(margs)", "    pass"),
        (', low_cpu_mem_usage=True, device_map="cpu")', ")"),
        ("'--no-bias-dropout-fusion',",
         "'--no-bias-dropout-fusion', '--no-rope-fusion', '--no-gradient-accumulation-fusion',")],
}
_CPU_RUNNER = """import os, runpy, sys
from ascend_engine.device import select_backend
select_backend("cpu").apply()
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def megatron_copy(megatron: Path, work: Path) -> Path:
    """A patched temporary copy of Megatron-LM's converter and a runner that applies the CPU shim first."""
    peer = work / "megatron-tools"
    shutil.rmtree(peer, ignore_errors=True)  # a --workdir from an earlier run: patch a fresh copy
    shutil.copytree(megatron / "tools" / "checkpoint", peer)
    shutil.copyfile(megatron / "pretrain_gpt.py", peer / "pretrain_gpt.py")
    for name, patches in _PATCHES.items():
        text = (peer / name).read_text()
        for old, new in patches:
            if old not in text:
                raise SystemExit(f"{megatron}: {name} lacks {old!r}; this benchmark patches core_v0.12.1")
            text = text.replace(old, new)
        (peer / name).write_text(text)
    (peer / "cpu_runner.py").write_text(_CPU_RUNNER)
    return peer


def _layers(hf: Path) -> int | None:
    try:
        return json.loads((hf / "config.json").read_text())["num_hidden_layers"]
    except (OSError, ValueError, KeyError):
        return None


def _header(path: Path) -> dict:
    with path.open("rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    header.pop("__metadata__", None)
    return header


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", help="scratch folder (default: a temporary one, removed afterwards)")
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--megatron-lm", type=Path, help="Megatron-LM core_v0.12.1 checkout to compare with")
    parser.add_argument("--make-only", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.make_only:
        print(make_model(Path(opts.make_only), opts.layers))
        return
    work = Path(opts.workdir or tempfile.mkdtemp(prefix="convert-bench-"))
    hf = work / "hf"
    try:
        t0 = time.perf_counter()
        if _layers(hf) != opts.layers:  # a --workdir from an earlier run keeps its model
            shutil.rmtree(hf, ignore_errors=True)
            # Made in a child: a child's peak RSS starts from its parent's at fork, so this process stays small.
            subprocess.run([sys.executable, __file__, "--make-only", str(hf), "--layers", str(opts.layers)],
                           check=True, capture_output=True, text=True)
        params = sum(math.prod(e["shape"]) for f in hf.glob("*.safetensors") for e in _header(f).values())
        size = folder_bytes(hf)
        print(f"model: {params / 1e9:.2f}B parameters, {size / 1e9:.2f} GB bf16 safetensors, {opts.layers} layers "
              f"(made in {time.perf_counter() - t0:.0f} s); {os.cpu_count()} CPUs, load average "
              f"{os.getloadavg()[0]:.1f}")

        def fresh(path: Path):
            return lambda _round: shutil.rmtree(path, ignore_errors=True)

        contenders = [Contender("cp -r", lambda r: ["cp", "-r", str(hf), str(work / "copy")], fresh(work / "copy"))]
        for tp, pp in LAYOUTS:
            out = work / f"ours-tp{tp}pp{pp}"
            contenders.append(Contender(
                f"ascend-engine convert TP{tp} PP{pp}",
                lambda r, out=out, tp=tp, pp=pp: [
                    sys.executable, "-m", "ascend_engine.cli", "convert", "--load-model-type", "hf",
                    "--save-model-type", "mg", "--load-dir", str(hf), "--save-dir", str(out),
                    "--target-tensor-parallel-size", str(tp), "--target-pipeline-parallel-size", str(pp),
                    "--make-vocab-size-divisible-by", "1"], fresh(out)))
        if opts.megatron_lm:
            peer = megatron_copy(opts.megatron_lm.resolve(), work)
            env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(opts.megatron_lm.resolve()))
            for tp, pp in LAYOUTS:
                out = work / f"megatron-tp{tp}pp{pp}"
                contenders.append(Contender(
                    f"Megatron-LM convert.py TP{tp} PP{pp}",
                    lambda r, out=out, tp=tp, pp=pp: [
                        sys.executable, str(peer / "cpu_runner.py"), str(peer / "convert.py"), "--model-type", "GPT",
                        "--loader", "llama_mistral", "--true-vocab-size", str(SHAPE["vocab_size"]),
                        "--saver", "core", "--model-size", "llama3", "--checkpoint-type", "hf", "--bf16",
                        "--load-dir", str(hf), "--save-dir", str(out), "--tokenizer-model", str(hf),
                        "--target-tensor-parallel-size", str(tp), "--target-pipeline-parallel-size", str(pp),
                        "--loader-transformer-impl", "local", "--saver-transformer-impl", "local",
                        "--make-vocab-size-divisible-by", "1",
                        "--megatron-path", str(opts.megatron_lm.resolve())], fresh(out), env=env, cwd=str(peer)))
        subprocess.run(["cat", *map(str, hf.glob("*.safetensors"))], stdout=subprocess.DEVNULL, check=True)
        interleave(contenders, opts.rounds)
        print(f"\n{opts.rounds} interleaved rounds, {size / 1e9:.2f} GB model, load average now "
              f"{os.getloadavg()[0]:.1f}:")
        print(table(contenders, contenders[0], size))
    finally:
        if not opts.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
