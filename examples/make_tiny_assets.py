"""Make what examples/pipeline.yaml expects, tiny and random, so the whole pipeline runs on a laptop's CPU:

    <dir>/models/tiny-qwen3/   a Qwen3-shaped HuggingFace model (2 layers, hidden 64, GQA 4:2, q/k norms) with a
                               byte-level BPE tokenizer that has Qwen's chat tokens
    <dir>/data/alpaca.jsonl    Alpaca records (instruction / input / output)
    <dir>/data/pairs.jsonl     Alpaca preference pairs (instruction / input / chosen / rejected), for
                               examples/pipeline-dpo.yaml
    <dir>/data/arithmetic.jsonl  one-digit additions (question / answer), the RL prompts of
                               examples/pipeline-grpo.yaml

On the local cluster the pipeline's PVC `ascend-workspace` is the directory
`.local-cluster/pvc/default/ascend-workspace`:

    ascend-train local up &                      # API + pod runner + operator
    python examples/make_tiny_assets.py .local-cluster/pvc/default/ascend-workspace
    ascend-train apply -f examples/pipeline.yaml && ascend-train get atj
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

# The model shape examples/pipeline.yaml trains (spec.train.model there must say the same).
SHAPE = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=128, tie_word_embeddings=False)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
RECORDS = [
    {"instruction": "Give three tips for staying healthy.", "input": "", "output": "Eat well, sleep, exercise."},
    {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"},
    {"instruction": "What is the capital of France?", "input": "", "output": "Paris."},
    {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
    {"instruction": "Name a primary colour.", "input": "", "output": "Red."},
    {"instruction": "Reverse the word.", "input": "stressed", "output": "desserts"},
    {"instruction": "Say hello politely.", "input": "", "output": "Hello, nice to meet you."},
    {"instruction": "Is the sky blue on a clear day?", "input": "", "output": "Yes."},
]


def make_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [" ".join(str(v) for v in r.values()) for r in RECORDS] * 10 + ["user assistant system"] * 10
    trainer = trainers.BpeTrainer(vocab_size=SHAPE["vocab_size"], special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIAL[1:])
    assert len(fast) <= SHAPE["vocab_size"], len(fast)
    fast.save_pretrained(out)


def make_model(out: Path, seed: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(Qwen3Config(**SHAPE), dtype=torch.float32)
    model.save_pretrained(out)


def write_benchmarks(data: Path) -> None:
    """A tiny MMLU (dev/test csv per subject) and BoolQ (jsonl) in their published formats, for evaluation."""
    rows = [["What is the capital of France?", "Paris", "Rome", "Berlin", "Madrid", "A"],
            ["Which number is even?", "3", "4", "5", "7", "B"],
            ["What colour is the sky on a clear day?", "green", "red", "blue", "black", "C"],
            ["How many legs does a spider have?", "two", "four", "six", "eight", "D"]]
    for split, part in (("dev", rows[:1]), ("test", rows)):
        (data / "mmlu" / split).mkdir(parents=True, exist_ok=True)
        with open(data / "mmlu" / split / f"general_knowledge_{split}.csv", "w", newline="") as f:
            csv.writer(f).writerows(part)
    boolq = [{"question": "is paris the capital of france", "passage": "Paris is the capital of France.",
              "answer": True},
             {"question": "is the sky green", "passage": "On a clear day the sky is blue.", "answer": False}]
    (data / "boolq.jsonl").write_text("".join(json.dumps(r) + "\n" for r in boolq))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, help="the workspace directory (the PVC's directory on the local cluster)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    model_dir = args.dir / "models" / "tiny-qwen3"
    model_dir.mkdir(parents=True, exist_ok=True)
    make_model(model_dir, args.seed)
    make_tokenizer(model_dir)
    data = args.dir / "data" / "alpaca.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS * 4))
    write_benchmarks(args.dir / "data")
    # Each prompt's own answer is chosen, the next record's answer rejected.
    pairs = [{"instruction": r["instruction"], "input": r["input"], "chosen": r["output"],
              "rejected": RECORDS[(i + 1) % len(RECORDS)]["output"]} for i, r in enumerate(RECORDS)]
    (data.parent / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs * 4))
    sums = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(1, 10) for b in range(1, 10)]
    (data.parent / "arithmetic.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sums))
    print(f"wrote {model_dir}, {data} ({len(RECORDS) * 4} records), pairs.jsonl ({len(pairs) * 4} pairs), "
          f"arithmetic.jsonl ({len(sums)} prompts) and tiny MMLU / BoolQ sets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
