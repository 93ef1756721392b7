"""R1AlpacaStyleInstructionHandler: RL prompts rendered with the template up to the assistant header, and the
reference answer kept as labels, in MindSpeed's ``_packed_{input_ids,attention_mask,labels}_document`` files."""
from __future__ import annotations

import json

import pytest
from prep_support import preprocess, read_dataset, tokenizer, tokenizer_dir, write_jsonl  # noqa: F401

R1_INSTRUCTION = ("A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
                  "The assistant first thinks about the reasoning process in the mind and then provides the user "
                  "with the answer. The reasoning process and answer are enclosed within <think> </think> and "
                  "<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think><answer> "
                  "answer here </answer>Put your final answer within \\boxed{}.\n")
RECORDS = [{"question": "What is 12 + 30?", "answer": "42"},
           {"question": "Give tips for health", "answer": "Eat well, sleep, exercise."}]
MAP_KEYS = json.dumps({"prompt": "question", "query": "", "response": "answer", "system": ""})


def run(tmp_path, tokenizer_dir, records, *extra):
    prefix = tmp_path / "out" / "r1"
    rc = preprocess("--input", write_jsonl(tmp_path / "r1.jsonl", records), "--tokenizer-name-or-path",
                    tokenizer_dir, "--output-prefix", prefix, "--handler-name", "R1AlpacaStyleInstructionHandler",
                    "--map-keys", MAP_KEYS, *extra)
    return rc, str(prefix)


def test_prompt_up_to_the_assistant_header_and_the_reference_as_labels(tmp_path, tokenizer_dir, tokenizer):
    rc, prefix = run(tmp_path, tokenizer_dir, RECORDS, "--prompt-type", "qwen_r1")
    assert rc == 0
    ids = read_dataset(f"{prefix}_packed_input_ids_document")
    mask = read_dataset(f"{prefix}_packed_attention_mask_document")
    labels = read_dataset(f"{prefix}_packed_labels_document")
    assert len(ids) == len(mask) == len(labels) == 2
    enc = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    for record, i, m, lab in zip(RECORDS, ids, mask, labels):
        expected = (f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{R1_INSTRUCTION}"
                    f"{record['question']}<|im_end|>\n<|im_start|>assistant\n")
        assert tokenizer.decode(i.tolist()) == expected
        assert i.tolist()[-3:] == enc("<|im_start|>assistant\n")[-3:]
        assert m.tolist() == [1] * len(i)
        assert lab.tolist() == enc(record["answer"])  # the reference, unmasked and without the template
        assert tokenizer.decode(lab.tolist()) == record["answer"]


def test_history_stays_in_the_prompt_and_over_long_prompts_are_bad_records(tmp_path, tokenizer_dir, tokenizer):
    record = {"question": "and 2 + 2?", "answer": "4", "history": [["1 + 1?", "2"]]}
    keys = json.dumps({"prompt": "question", "response": "answer", "history": "history"})
    prefix = tmp_path / "h"
    assert preprocess("--input", write_jsonl(tmp_path / "h.jsonl", [record]), "--tokenizer-name-or-path",
                      tokenizer_dir, "--output-prefix", prefix, "--handler-name", "R1AlpacaStyleInstructionHandler",
                      "--map-keys", keys, "--prompt-type", "qwen") == 0
    text = tokenizer.decode(read_dataset(f"{prefix}_packed_input_ids_document")[0].tolist())
    assert text.endswith("user\n1 + 1?<|im_end|>\n<|im_start|>assistant\n2<|im_end|>\n"
                         "<|im_start|>user\nand 2 + 2?<|im_end|>\n<|im_start|>assistant\n")
    rc, _ = run(tmp_path, tokenizer_dir, RECORDS, "--prompt-type", "qwen_r1", "--seq-length", "16")
    assert rc != 0


def test_r1_prompts_cannot_be_packed_and_need_a_reference(tmp_path, tokenizer_dir, capsys):
    rc, _ = run(tmp_path, tokenizer_dir, RECORDS, "--prompt-type", "qwen_r1", "--pack", "--seq-length", "512")
    assert rc != 0
    assert "cannot be packed" in capsys.readouterr().err
    rc, _ = run(tmp_path, tokenizer_dir, [{"question": "no answer"}], "--prompt-type", "qwen_r1")
    assert rc != 0
    assert "r1.jsonl" in capsys.readouterr().err
