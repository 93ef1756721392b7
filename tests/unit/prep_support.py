"""Shared pieces of the preprocessing tests: a tiny local tokenizer and helpers to run and read back.

No tests live here; the other ``test_prep_*`` modules import it (named without test_ so pytest collects nothing from it; pytest puts this folder on sys.path).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<|begin_of_text|>",
           "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Give three tips for staying healthy. Eat well, sleep, exercise.",
    "user assistant system tool response instruction input output",
    "你好，世界。数据预处理把文本变成词元。",
    "Megatron indexed datasets hold tokens back to back with an index.",
] * 20


def build_tokenizer(directory: Path) -> Path:
    """A byte-level BPE with the chat special tokens, saved as a HuggingFace tokenizer directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   bos_token="<s>", additional_special_tokens=SPECIAL[1:])
    fast.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n"
                            for r in records))
    return path


def preprocess(*argv: str) -> int:
    """``ascend-engine preprocess ARGV`` in this process."""
    from ascend_engine.cli import main

    return main(["preprocess", *map(str, argv)])


def read_dataset(prefix: str) -> list[np.ndarray]:
    """Every sequence of ``<prefix>.{bin,idx}`` through megatron-core's own reader."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(prefix, mmap=False)
    return [np.asarray(ds[i]) for i in range(len(ds))]
