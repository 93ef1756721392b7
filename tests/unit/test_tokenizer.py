"""The inference commands' tokenizer read from ``tokenizer.json`` (``ascend_engine.tokenizer``) against
transformers' ``AutoTokenizer`` on the same directory: the same ids, text, vocabulary size and special tokens; and
transformers' own tokenizer wherever its config would make transformers change what the file says."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prep_support import CORPUS, build_tokenizer

TEXTS = ["", " ", "Hello  world!\n\nNew line\ttab", "<s>already a bos</s> and <|im_start|>user<|im_end|>",
         "你好，世界。", "w1 w2 unknownword w3 ,.", *CORPUS[:5]]


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


@pytest.fixture(scope="module", params=["byte-level BPE", "word level", "bos template"])
def directory(request, tmp_path_factory) -> Path:
    build = {"byte-level BPE": build_tokenizer, "word level": _word_level, "bos template": _with_bos_template}
    return build[request.param](tmp_path_factory.mktemp("tok"))


def test_reading_the_file_gives_transformers_ids_text_and_special_tokens(directory):
    from transformers import AutoTokenizer

    from ascend_engine.tokenizer import FileTokenizer, load_tokenizer

    ours, theirs = load_tokenizer(str(directory)), AutoTokenizer.from_pretrained(directory)
    assert isinstance(ours, FileTokenizer)
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


@pytest.mark.parametrize("file, changes", [
    ("tokenizer_config.json", {"add_bos_token": True}),  # transformers rewrites the post-processor
    ("tokenizer_config.json", {"tokenizer_class": "Qwen2Tokenizer"}),  # a family class rebuilds the pipeline
    ("tokenizer_config.json", {"bos_token": "<bos-not-in-the-file>"}),  # transformers adds the token
    ("tokenizer_config.json", {"split_special_tokens": True}),
])
def test_a_config_that_changes_the_file_gets_transformers_tokenizer(tmp_path, file, changes):
    from ascend_engine.tokenizer import FileTokenizer, load_tokenizer

    build_tokenizer(tmp_path)
    _edit(tmp_path, file, **changes)
    assert FileTokenizer.read(tmp_path) is None
    assert not isinstance(load_tokenizer(str(tmp_path)), FileTokenizer)


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
