"""GRPO step time split into rollout and update, next to an SFT step on the same rows.

A GRPO step samples G prompts x n responses with the policy (KV-cache generation, ``timing/rollout_s`` in the log
line: generation plus rewards) and then trains on those G x n rows (``timing/update_s``: the reference forward
and the policy's forward+backward). The SFT step trains on G x n rows of the same length, so it is the update's
physical reference: the update should cost about one SFT step plus a reference forward.

Each block runs ``ascend-engine train`` once per stage (a fresh process, first iterations dropped as warm-up) and
the blocks alternate SFT, GRPO, SFT, GRPO, ... so load on a shared machine hits both alike; the script prints the
median and spread of each figure.

    python benchmarks/grpo_step.py [--blocks 3 --steps 4 --hidden-size 256 --num-layers 4 --prompts 4 --samples 8]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

MS = re.compile(r"elapsed time per iteration \(ms\): ([\d.]+)")
FIELD = r"{}: ([-+\d.eE]+)"


def write(prefix: Path, rows: list[tuple[np.ndarray, np.ndarray]]) -> None:
    from ascend_engine.prep.indexed import IndexedDatasetWriter

    for key in ("input_ids", "attention_mask", "labels"):
        w = IndexedDatasetWriter(str(prefix).replace("KEY", key), np.int32)
        pick = {"input_ids": lambda r: r[0], "attention_mask": lambda r: np.ones_like(r[0]),
                "labels": lambda r: r[1]}[key]
        w.add(np.concatenate([pick(r) for r in rows]).astype(np.int32), np.array([len(pick(r)) for r in rows]))
        w.finish()
        w.commit()


def make_tokenizer(out: Path, vocab: int) -> None:
    """A byte-level BPE of ``vocab`` entries with an EOS that random weights almost never sample early."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [" ".join(str(i * j) for j in range(50)) for i in range(200)]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(out)


def make_data(root: Path, prompts: int, prompt_len: int, new: int, vocab: int) -> None:
    rng = np.random.default_rng(0)
    r1 = [(rng.integers(1, vocab, prompt_len), rng.integers(1, vocab, 2)) for _ in range(prompts)]
    write(root / "r1_packed_KEY_document", r1)
    sft = []
    for _ in range(prompts * 8):
        ids = rng.integers(1, vocab, prompt_len + new)
        sft.append((ids, np.concatenate([np.full(prompt_len, -100), ids[prompt_len:]])))
    write(root / "sft_packed_KEY_document", sft)


def run(cfg: dict, path: Path, warmup: int) -> dict[str, float]:
    path.write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")}
    proc = subprocess.run([sys.executable, "-m", "ascend_engine.cli", "train", "--config", str(path)],
                          capture_output=True, text=True, env=env)
    if proc.returncode:
        sys.exit(proc.stderr[-3000:])
    out = {"step_ms": statistics.median([float(m) for m in MS.findall(proc.stdout)][warmup:])}
    for key in ("timing/rollout_s", "timing/update_s", "tokens_per_s/rollout", "tokens_per_s/update",
                "grpo/response_length"):
        found = [float(m) for m in re.findall(FIELD.format(re.escape(key)), proc.stdout)][warmup:]
        if found:
            out[key] = statistics.median(found)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--prompts", type=int, default=4, help="prompts per step (G)")
    p.add_argument("--samples", type=int, default=8, help="responses per prompt (n)")
    p.add_argument("--prompt-length", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=1000)
    p.add_argument("--kl-coef", type=float, default=0.01)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    rows, seq = args.prompts * args.samples, args.prompt_length + args.new_tokens
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_tokenizer(root / "tok", args.vocab_size)
        make_data(root, 8 * args.prompts, args.prompt_length, args.new_tokens, args.vocab_size)
        base = {"device": args.device,
                "model": {"numLayers": args.num_layers, "hiddenSize": args.hidden_size, "numAttentionHeads": 4,
                          "vocabSize": args.vocab_size},
                "optimizer": {"lrDecayStyle": "constant", "lr": 1e-5}, "observability": {"metricsPort": 0}}
        training = {"seqLength": seq, "trainIters": args.warmup + args.steps}
        sft = {**base, "data": {"dataPath": [str(root / "sft")], "isInstructionDataset": True},
               "training": {**training, "microBatchSize": rows, "globalBatchSize": rows}}
        grpo = {**base, "stage": "grpo", "data": {"dataPath": [str(root / "r1")], "tokenizerNameOrPath": str(root / "tok")},
                "training": {**training, "microBatchSize": args.prompts, "globalBatchSize": args.prompts},
                "grpo": {"nSamplesPerPrompt": args.samples,
                         "maxNewTokens": args.new_tokens, "klCoef": args.kl_coef, "verifierFunction": ["math"]}}
        results: dict[str, list[dict[str, float]]] = {"sft": [], "grpo": []}
        for block in range(args.blocks):
            for name, cfg in (("sft", sft), ("grpo", grpo)):
                results[name].append(run(cfg, root / f"{name}.yaml", args.warmup))
            g = results["grpo"][-1]
            print(f"block {block + 1}: sft {results['sft'][-1]['step_ms']:.0f} ms/step, grpo {g['step_ms']:.0f} "
                  f"ms/step (rollout {1000 * g['timing/rollout_s']:.0f} ms, update {1000 * g['timing/update_s']:.0f}"
                  f" ms)", flush=True)

    def summary(name: str, key: str, scale: float = 1.0) -> tuple[float, str]:
        values = [r[key] * scale for r in results[name]]
        med = statistics.median(values)
        return med, f"median {med:9.1f} ({min(values):.1f} .. {max(values):.1f})"

    threads = os.environ.get("OMP_NUM_THREADS", "default")
    print(f"device {args.device} ({os.cpu_count()} CPU threads, torch threads {threads}),"
          f" layers {args.num_layers}, hidden {args.hidden_size}, vocab {args.vocab_size}, {args.prompts} prompts x "
          f"{args.samples} samples = {rows} rows of {seq} tokens, up to {args.new_tokens} new tokens, "
          f"klCoef {args.kl_coef}, {args.blocks} blocks")
    step, text = summary("grpo", "step_ms")
    print(f"grpo step ms:             {text}")
    rollout, text = summary("grpo", "timing/rollout_s", 1000)
    print(f"  rollout ms:             {text}  ({100 * rollout / step:.0f}% of the step)")
    update, text = summary("grpo", "timing/update_s", 1000)
    print(f"  update ms:              {text}  ({100 * update / step:.0f}% of the step)")
    print(f"  rollout new tokens/s:   {summary('grpo', 'tokens_per_s/rollout')[1]}")
    print(f"  update tokens/s:        {summary('grpo', 'tokens_per_s/update')[1]}")
    print(f"  mean response length:   {summary('grpo', 'grpo/response_length')[1]}")
    sft_ms, text = summary("sft", "step_ms")
    print(f"sft step ms (same rows):  {text}")
    print(f"grpo update / sft step = {update / sft_ms:.2f} (expected about 1.33 with the reference forward)")


if __name__ == "__main__":
    main()
