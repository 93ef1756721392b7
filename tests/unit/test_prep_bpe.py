"""tiktoken stands in for a HuggingFace byte-level BPE only where it gives the same ids as ``tokenizer(text)``
(Megatron-LM's call), and the output bytes do not depend on which one ran or on the worker count."""
from __future__ import annotations

import base64
import json
import random
from pathlib import Path

import pytest
from prep_support import SPECIAL, preprocess, read_dataset, tokenizer_dir, write_jsonl  # noqa: F401

QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                 r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "IT'S, it's, I'LL, we'Re, THEY'D 's 'S don't",
    "def f(x):\n\treturn x ** 2  # comment\r\n\r\n\n  indented\n",
    "   leading and trailing spaces   ",
    "numbers 1234567890 3.14159 1,000,000 ٣٤٥ ⅷ",
    "你好，世界。数据预处理把文本变成词元。",
    "mixed 中文 and English、テスト、한국어 Ελληνικά русский",
    "emoji 🤖🚀👩‍👩‍👧 and symbols ©®™ ∑∫√",
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nhi<|im_end|><|endoftext|>",
    "glued<|endoftext|>text, <|im_end and <|im_start|<|endoftext|>>",
    "not NFC: e\u0301 cafe\u0301 A\u030a \u1e0b\u0323",
    "whitespace kinds: \u00a0 \u2003 \u3000 \u2028 \u0085 \x0b\x0c \t\t end",
    "",
    "a" * 300 + " " + "ab" * 100 + " " + "-" * 77 + " " + "=" * 40,
]


@pytest.fixture(autouse=True)
def no_stamps(tmp_path, monkeypatch):
    """Every test checks the merges itself: stamps of passed checks go to a fresh cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "ascend-engine" / "exact-bpe"


def soup(n: int) -> list[str]:
    """Random strings over ASCII, Latin-1, Greek, CJK, emoji, combining marks and odd whitespace."""
    rng = random.Random(7)
    ranges = [(0x20, 0x7E), (0x09, 0x0D), (0xA0, 0xFF), (0x370, 0x3FF), (0x4E00, 0x4E80), (0x1F600, 0x1F64F),
              (0x300, 0x36F), (0x2000, 0x200F), (0x3000, 0x3003)]
    return ["".join(chr(rng.randint(*rng.choice(ranges))) for _ in range(rng.randint(1, 60))) for _ in range(n)]


@pytest.fixture(scope="module", params=["qwen2", "gpt2", "trained"])
def tiktoken_shaped(request, tmp_path_factory, tokenizer_dir) -> Path:
    """Byte-level BPEs that tiktoken may run: the test tokenizer as trained (one merge per token), or its
    vocabulary as tiktoken ranks converted back as transformers converts tiktoken files (every split a merge,
    merges in rank order) in Qwen2's layout (NFC, split regex, merges run even on whole-token words) or GPT-2's
    (ByteLevel's own regex, whole-token words kept whole)."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter, bytes_to_unicode

    if request.param == "trained":
        return tokenizer_dir
    decode = {c: b for b, c in bytes_to_unicode().items()}
    vocab = json.loads(Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).to_str())["model"]["vocab"]
    tokens = sorted((i, bytes(decode[c] for c in t)) for t, i in vocab.items() if t not in SPECIAL)
    directory = tmp_path_factory.mktemp(f"tiktoken-{request.param}")
    ranks = directory / "ranks.tiktoken"
    ranks.write_text("".join(f"{base64.b64encode(t).decode()} {rank}\n" for rank, (_, t) in enumerate(tokens)))
    tok = TikTokenConverter(vocab_file=str(ranks), pattern=QWEN2_PATTERN, extra_special_tokens=SPECIAL[:3]).converted()
    if request.param == "qwen2":
        tok.normalizer = normalizers.NFC()
        tok.model.ignore_merges = False
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                            additional_special_tokens=SPECIAL[1:3]).save_pretrained(directory)
    return directory


def variant(source: Path, directory: Path, change) -> Path:
    """A copy of a saved tokenizer with ``change(state)`` applied to its ``tokenizer.json``."""
    directory.mkdir()
    state = json.loads((source / "tokenizer.json").read_text())
    change(state)
    (directory / "tokenizer.json").write_text(json.dumps(state))
    (directory / "tokenizer_config.json").write_text((source / "tokenizer_config.json").read_text())
    return directory


def test_tiktoken_gives_the_tokenizers_ids(tiktoken_shaped, no_stamps):
    from transformers import AutoTokenizer

    from ascend_engine.prep.encode import TextEncoder

    tok = AutoTokenizer.from_pretrained(tiktoken_shaped)
    encode = TextEncoder(tok)
    assert encode.bpe == "tiktoken"
    texts = TEXTS + soup(400)
    assert encode(texts) == [tok(t).input_ids for t in texts]
    assert len(list(no_stamps.iterdir())) == 1  # the next load of this tokenizer skips the merge checks
    assert TextEncoder(tok)(texts) == encode(texts)


def drop_a_merge(state: dict) -> None:
    """Without the merge that makes " the", the merges no longer rebuild that token from its bytes."""
    state["model"]["merges"] = [m for m in state["model"]["merges"] if "".join(m) != "Ġthe"]


@pytest.mark.parametrize("change, why", [
    (lambda state: state.update(normalizer={"type": "Lowercase"}), "normalizer Lowercase"),
    (drop_a_merge, "tokens are not what the merges make of their bytes (e.g. 'Ġthe')"),
])
def test_other_tokenizers_keep_the_huggingface_bpe(tmp_path, tokenizer_dir, no_stamps, change, why):
    from transformers import AutoTokenizer

    from ascend_engine.prep.encode import TextEncoder

    tok = AutoTokenizer.from_pretrained(variant(tokenizer_dir, tmp_path / "tok", change))
    encode = TextEncoder(tok)
    assert encode.bpe.startswith("huggingface (") and why in encode.bpe
    texts = TEXTS + soup(50)
    assert encode(texts) == [tok(t).input_ids for t in texts]
    assert not no_stamps.exists()


def test_tiktoken_runs_write_the_tokenizers_ids_for_any_worker_count(tmp_path, tiktoken_shaped):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiktoken_shaped)
    texts = [t for t in TEXTS + soup(60) if t.strip()] * 5
    data = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in texts])
    outputs = {}
    for workers in (1, 2):
        prefix = tmp_path / f"w{workers}" / "p"
        assert preprocess("--input", data, "--tokenizer-name-or-path", tiktoken_shaped, "--output-prefix", prefix,
                          "--workers", workers, "--chunk-size", "16", "--append-eod") == 0
        assert json.loads(Path(f"{prefix}_manifest.json").read_text())["bpe"] == "tiktoken"
        outputs[workers] = [Path(f"{prefix}_text_document.{ext}").read_bytes() for ext in ("bin", "idx")]
    assert outputs[1] == outputs[2]
    got = [a.tolist() for a in read_dataset(str(tmp_path / "w1" / "p_text_document"))]
    assert got == [tok(t).input_ids + [tok.eos_token_id] for t in texts]
