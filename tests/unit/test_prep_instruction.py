"""Instruction and preference data: templates, loss masks over system and history, ShareGPT/OpenAI forms."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prep_support import preprocess, read_dataset, tokenizer, tokenizer_dir, write_jsonl  # noqa: F401

ALPACA = {"instruction": "Give tips", "input": "health", "output": "Eat well", "system": "Be nice",
          "history": [["hi", "hello"], ["how are you", "fine, thanks"]]}
TURNS = [("hi", "hello"), ("how are you", "fine, thanks"), ("Give tips\nhealth", "Eat well")]
CHATML_JINJA = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def run(tmp_path: Path, tokenizer_dir, records, handler="AlpacaStyleInstructionHandler", *extra, name="sft"):
    prefix = tmp_path / "out" / name
    rc = preprocess("--input", write_jsonl(tmp_path / f"{name}.jsonl", records), "--tokenizer-name-or-path",
                    tokenizer_dir, "--output-prefix", prefix, "--handler-name", handler, *extra)
    assert rc == 0
    return str(prefix)


def sample(prefix: str, i: int = 0, side: str = "") -> tuple[list[int], list[int], list[int]]:
    return tuple(read_dataset(f"{prefix}_packed_{side}{k}_document")[i].tolist()
                 for k in ("input_ids", "attention_mask", "labels"))


def label_spans(ids: list[int], labels: list[int]) -> list[list[int]]:
    """Runs of trained tokens; every trained label must equal its input token."""
    spans, current = [], []
    for t, lab in zip(ids, labels):
        if lab == -100:
            if current:
                spans.append(current)
            current = []
        else:
            assert lab == t
            current.append(t)
    return spans + ([current] if current else [])


def test_alpaca_qwen_matches_the_chat_template_and_masks_every_prompt(tmp_path, tokenizer_dir, tokenizer):
    prefix = run(tmp_path, tokenizer_dir, [ALPACA], "AlpacaStyleInstructionHandler", "--prompt-type", "qwen")
    ids, mask, labels = sample(prefix)
    messages = [{"role": "system", "content": "Be nice"}]
    for q, a in TURNS:
        messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    rendered = tokenizer.apply_chat_template(messages, chat_template=CHATML_JINJA, tokenize=False)
    assert tokenizer.decode(ids) == rendered.removesuffix("\n")
    assert mask == [1] * len(ids)
    # Exactly the replies (with their end-of-turn token) are trained, history replies included.
    enc = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert label_spans(ids, labels) == [enc(f"{a}<|im_end|>") for _, a in TURNS]
    pieces = ["<|im_start|>system\nBe nice<|im_end|>\n"]
    for i, (q, a) in enumerate(TURNS):
        pieces += (["\n"] if i else []) + [f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n",
                                           f"{a}<|im_end|>"]
    assert ids == [t for p in pieces for t in enc(p)]


def test_sharegpt_and_openai_messages_equal_the_alpaca_form(tmp_path, tokenizer_dir):
    alpaca = run(tmp_path, tokenizer_dir, [ALPACA], "AlpacaStyleInstructionHandler", "--prompt-type", "qwen",
                 name="alpaca")
    convs = [{"from": "system", "value": "Be nice"}]
    for q, a in TURNS:
        convs += [{"from": "human", "value": q}, {"from": "gpt", "value": a}]
    sharegpt = run(tmp_path, tokenizer_dir, [{"conversations": convs}], "SharegptStyleInstructionHandler",
                   "--prompt-type", "qwen", name="sharegpt")
    roles = {"system": "system", "human": "user", "gpt": "assistant"}
    openai = run(tmp_path, tokenizer_dir, [{"messages": [{"role": roles[m["from"]], "content": m["value"]}
                                                         for m in convs]}],
                 "SharegptStyleInstructionHandler", "--prompt-type", "qwen", "--map-keys",
                 '{"messages":"messages", "tags":{"role_tag": "role","content_tag": "content",'
                 '"user_tag": "user","assistant_tag": "assistant","system_tag": "system"}}', name="openai")
    for key in ("input_ids", "attention_mask", "labels"):
        reference = Path(f"{alpaca}_packed_{key}_document.bin").read_bytes()
        assert Path(f"{sharegpt}_packed_{key}_document.bin").read_bytes() == reference
        assert Path(f"{openai}_packed_{key}_document.bin").read_bytes() == reference


@pytest.mark.parametrize("prompt_type, text, replies", [
    ("llama3", "<s><|start_header_id|>system<|end_header_id|>\n\nBe nice<|eot_id|>"
               "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant"
               "<|end_header_id|>\n\nhello<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nGive tips"
               "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nEat well<|eot_id|>",
     ["hello<|eot_id|>", "Eat well<|eot_id|>"]),
    ("llama2", "<s>[INST] <<SYS>>\nBe nice\n<</SYS>>\n\nhi [/INST]hello<|endoftext|><s>[INST] Give tips [/INST]"
               "Eat well<|endoftext|>", ["hello<|endoftext|>", "Eat well<|endoftext|>"]),
    ("qwen3", "<|im_start|>system\nBe nice<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
              "hello<|im_end|>\n<|im_start|>user\nGive tips<|im_end|>\n<|im_start|>assistant\nEat well<|im_end|>",
     ["hello<|im_end|>", "Eat well<|im_end|>"]),
    ("empty", "Be nicehihello<|endoftext|>Give tipsEat well<|endoftext|>",
     ["hello<|endoftext|>", "Eat well<|endoftext|>"]),
])
def test_builtin_templates(tmp_path, tokenizer_dir, tokenizer, prompt_type, text, replies):
    record = {"instruction": "Give tips", "output": "Eat well", "system": "Be nice", "history": [["hi", "hello"]]}
    ids, _, labels = sample(run(tmp_path, tokenizer_dir, [record], "AlpacaStyleInstructionHandler",
                                "--prompt-type", prompt_type))
    assert tokenizer.decode(ids) == text
    assert [tokenizer.decode(s) for s in label_spans(ids, labels)] == replies


def test_default_system_and_users_own_template_file(tmp_path, tokenizer_dir, tokenizer):
    record = {"instruction": "Q", "output": "A"}
    ids, _, _ = sample(run(tmp_path, tokenizer_dir, [record], "AlpacaStyleInstructionHandler", "--prompt-type",
                           "qwen", name="default"))
    assert tokenizer.decode(ids).startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    templates = tmp_path / "mine.yaml"
    templates.write_text("plain:\n  user: \"### Q: {content}\\n### A: \"\n  assistant: \"{content}{eos}\"\n")
    ids, _, labels = sample(run(tmp_path, tokenizer_dir, [record], "AlpacaStyleInstructionHandler",
                                "--prompt-type", "plain", "--prompt-type-path", templates, name="mine"))
    assert tokenizer.decode(ids) == "### Q: Q\n### A: A<|endoftext|>"
    assert [tokenizer.decode(s) for s in label_spans(ids, labels)] == ["A<|endoftext|>"]


def test_truncation_to_seq_length_is_reported_by_file_and_line(tmp_path, tokenizer_dir, capsys):
    long = {"instruction": "The quick brown fox jumps over the lazy dog. " * 20, "output": "Eat well, sleep. " * 10}
    records = [{"instruction": "hi", "output": "hello"}, long, long]
    prefix = run(tmp_path, tokenizer_dir, records, "AlpacaStyleInstructionHandler", "--prompt-type", "chatml",
                 "--seq-length", "48", "--max-reported-errors", "1")
    ids, _, labels = sample(prefix, 1)
    assert len(ids) == 48 and len(labels) == 48
    trained = sum(lab != -100 for lab in labels)
    assert 0 < trained < 48  # prompt and reply both shortened, in proportion
    manifest = json.loads(Path(f"{prefix}_manifest.json").read_text())
    assert manifest["records"]["truncated"] == 2
    assert manifest["truncations"]["count"] == 2 and len(manifest["truncations"]["listed"]) == 1
    first = manifest["truncations"]["listed"][0]
    assert first["where"].endswith("sft.jsonl:2")
    assert re.fullmatch(rf"cut inside the prompt: \d+ tokens, 48 fit; prompt \d+ -> {48 - trained}, "
                        rf"reply \d+ -> {trained} tokens", first["message"]), first["message"]
    err = capsys.readouterr().err
    assert "truncated 2 of 3 sample(s) to seqLength 48:" in err and "sft.jsonl:2: cut inside the prompt" in err
    assert "... and 1 more" in err and "--no-truncation" in err


def test_no_truncation_makes_an_over_long_sample_an_error_that_stops_the_run(tmp_path, tokenizer_dir, capsys):
    long = {"instruction": "The quick brown fox jumps over the lazy dog. " * 20, "output": "Eat well"}
    rc = preprocess("--input", write_jsonl(tmp_path / "long.jsonl", [long]), "--tokenizer-name-or-path",
                    tokenizer_dir, "--output-prefix", tmp_path / "out" / "sft", "--handler-name",
                    "AlpacaStyleInstructionHandler", "--prompt-type", "chatml", "--seq-length", "48",
                    "--no-truncation")
    assert rc == 1
    assert "long.jsonl:1: sample has" in capsys.readouterr().err
    assert not (tmp_path / "out" / "sft_manifest.json").exists()


def test_pairwise_writes_chosen_and_rejected(tmp_path, tokenizer_dir, tokenizer):
    record = {"instruction": "Give tips", "input": "health", "chosen": "Eat well", "rejected": "Eat cake",
              "history": [["hi", "hello"]]}
    prefix = run(tmp_path, tokenizer_dir, [record], "AlpacaStylePairwiseHandler", "--prompt-type", "chatml")
    chosen, _, chosen_labels = sample(prefix, side="chosen_")
    rejected, _, rejected_labels = sample(prefix, side="rejected_")
    prompt = ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
              "<|im_start|>user\nGive tips\nhealth<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.decode(chosen) == prompt + "Eat well<|im_end|>"
    assert tokenizer.decode(rejected) == prompt + "Eat cake<|im_end|>"
    # Only the final replies are trained; the history reply is part of the shared prompt.
    assert [tokenizer.decode(s) for s in label_spans(chosen, chosen_labels)] == ["Eat well<|im_end|>"]
    assert [tokenizer.decode(s) for s in label_spans(rejected, rejected_labels)] == ["Eat cake<|im_end|>"]

    convs = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"},
             {"from": "human", "value": "Give tips\nhealth"}]
    sharegpt = run(tmp_path, tokenizer_dir, [{"conversations": convs, "chosen": {"from": "gpt", "value": "Eat well"},
                                              "rejected": {"from": "gpt", "value": "Eat cake"}}],
                   "SharegptStylePairwiseHandler", "--prompt-type", "chatml", name="sharegpt")
    for side in ("chosen", "rejected"):
        for key in ("input_ids", "attention_mask", "labels"):
            name = f"_packed_{side}_{key}_document.bin"
            assert Path(sharegpt + name).read_bytes() == Path(prefix + name).read_bytes()
