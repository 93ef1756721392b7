"""tiktoken in place of a HuggingFace byte-level BPE, only where it is shown at load time to give the same ids.

The HF tokenizers BPE is most of a pretraining run's work; tiktoken's is about 6x faster. Both split the text
with a regex and merge bytes pairwise; tiktoken merges by the rank of the merged token, HF by the position of
the pair in its merge list. ``exact_tiktoken`` builds a tiktoken ``Encoding`` from the HF tokenizer's own state
and returns it only when every condition below holds (otherwise None and the reason, and the HF path is used):

- normalizer: none or NFC (NFC text goes to tiktoken as is; any other text to HF, text by text);
- pre-tokenizer: a regex ``Split`` (isolated) then ``ByteLevel`` without its own regex and without a prefix
  space, or ``ByteLevel`` with GPT-2's regex; tiktoken gets the same pattern;
- model: BPE over byte-level symbols, all 256 bytes in the vocabulary, no dropout, no word prefix or suffix,
  no byte fallback;
- merges: every merge's result is a token, results in the order of their ids (merge order = rank), and the
  list holds every split of every token into two tokens (so both see the same candidate pairs);
- a whole word that is a token stays one token: ``ignore_merges``, or each token's own BPE gives itself;
- added tokens: special, matched as written (not normalized, no lstrip/rstrip/single-word), none a prefix
  of another; the post-processor adds no tokens to a single text.

The merge checks take ~1.3 s for a 150k vocabulary; a model that passed them leaves a stamp (the sha256 of its
state) in ``~/.cache/ascend-engine/exact-bpe``, so later runs with the same tokenizer skip them.

What the checks cannot cover, the regex engines (Oniguruma in HF, fancy-regex in tiktoken) reading the same
pattern alike and the order of equal-rank merges inside one word, ``tests/unit/test_prep_bpe.py`` compares on
varied text, and ``benchmarks/preprocess.py`` against Megatron-LM's per-document HF calls on its corpus.
"""
from __future__ import annotations

import hashlib
import json
import os
import unicodedata
from pathlib import Path

CHECKS = b"exact-bpe 1\n"  # change it when the checks change: stamps of the old checks no longer count
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, symbol -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols, extra = {}, 0
    for b in range(256):
        if b in printable:
            symbols[chr(b)] = b
        else:
            symbols[chr(256 + extra)] = b
            extra += 1
    return symbols


def _pattern(pre: dict | None) -> str | None:
    if not pre:
        return None
    if pre["type"] == "ByteLevel":
        return GPT2_PATTERN if pre.get("use_regex", True) and not pre.get("add_prefix_space") else None
    if pre["type"] != "Sequence" or len(pre["pretokenizers"]) != 2:
        return None
    split, level = pre["pretokenizers"]
    if (split["type"] != "Split" or "Regex" not in split["pattern"] or split["behavior"] != "Isolated"
            or split.get("invert") or level["type"] != "ByteLevel" or level.get("use_regex", True)
            or level.get("add_prefix_space")):
        return None
    return split["pattern"]["Regex"]


def _adds_tokens(post: dict | None) -> bool:
    """Whether a post-processor puts tokens around a single text (ByteLevel only fixes offsets)."""
    if post is None or post["type"] == "ByteLevel":
        return False
    if post["type"] == "TemplateProcessing":
        return any("SpecialToken" in piece for piece in post["single"])
    if post["type"] == "Sequence":
        return any(_adds_tokens(p) for p in post["processors"])
    return True


def _merge_problem(model: dict, bpe) -> str:
    """Why these merges do not merge as tiktoken does with the vocabulary's ids as ranks ('' when they do)."""
    vocab: dict[str, int] = model["vocab"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    last = -1
    for left, right in merges:
        rank = vocab.get(left + right)
        if rank is None or rank < last:
            return "merge order is not token rank"
        last = rank
    splits = sum(token[i:] in vocab for token in vocab for i in range(1, len(token)) if token[:i] in vocab)
    if splits != len(set(merges)):
        return "merges do not hold every split of every token"
    if not model.get("ignore_merges"):
        unreached = [t for t, i in vocab.items() if len(t) > 1 and [x.id for x in bpe.tokenize(t)] != [i]]
        if unreached:
            return f"{len(unreached)} tokens are not their own BPE (e.g. {unreached[0]!r})"
    return ""


def _checked_merges(bpe) -> str:
    """``_merge_problem`` of this BPE model, once per model: a model that passed leaves a stamp named by the
    sha256 of its whole state (vocabulary, merges, options) under ``~/.cache/ascend-engine/exact-bpe``."""
    state = bpe.__getstate__()
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    stamp = Path(root, "ascend-engine", "exact-bpe", hashlib.sha256(CHECKS + state).hexdigest())
    if stamp.exists():
        return ""
    why = _merge_problem(json.loads(state), bpe)
    if not why:
        try:
            stamp.parent.mkdir(parents=True, exist_ok=True)
            stamp.touch()
        except OSError:  # a read-only home: the check runs again next time
            pass
    return why


class TiktokenBPE:
    """``encode(texts)``: ids as the HF tokenizer gives them without special tokens added, for many texts."""

    def __init__(self, encoding, nfc: bool, fallback):
        self.encoding, self.nfc, self.fallback = encoding, nfc, fallback
        self.allowed = frozenset(encoding.special_tokens_set)

    def encode(self, texts: list[str]) -> list[list[int]]:
        out, rest = [], []
        for text in texts:
            try:
                text.encode("utf-8")  # a lone surrogate: HF reports it its own way
                exact = not self.nfc or unicodedata.is_normalized("NFC", text)
            except UnicodeEncodeError:
                exact = False
            if exact:
                out.append(self.encoding.encode(text, allowed_special=self.allowed, disallowed_special=()))
            else:
                rest.append(len(out))
                out.append(text)
        if rest:
            for i, ids in zip(rest, self.fallback([out[i] for i in rest])):
                out[i] = ids
        return out


def _state(component) -> dict | None:
    return None if component is None else json.loads(component.__getstate__())


def exact_tiktoken(backend, fallback) -> tuple[TiktokenBPE | None, str]:
    """tiktoken for this ``tokenizers.Tokenizer`` when it provably merges alike, else None and why not.
    ``fallback(texts)`` encodes the texts tiktoken is not given (not NFC, lone surrogates) with HF."""
    try:
        import tiktoken
    except ImportError:
        return None, "tiktoken is not installed"
    from tokenizers.models import BPE

    normalizer = _state(backend.normalizer)
    if normalizer is not None and normalizer["type"] != "NFC":
        return None, f"normalizer {normalizer['type']}"
    pattern = _pattern(_state(backend.pre_tokenizer))
    if pattern is None:
        return None, "pre-tokenizer is not a regex split with byte-level symbols"
    if _adds_tokens(_state(backend.post_processor)):
        return None, "the post-processor adds tokens"
    bpe = backend.model
    if (not isinstance(bpe, BPE) or bpe.dropout or bpe.continuing_subword_prefix or bpe.end_of_word_suffix
            or bpe.byte_fallback):
        return None, "model is not a plain BPE"
    vocab = backend.get_vocab(with_added_tokens=False)
    decoder = _byte_decoder()
    if not set("".join(vocab)) <= decoder.keys():
        return None, "vocabulary is not byte-level"
    if not decoder.keys() <= vocab.keys():
        return None, "not all 256 bytes are tokens"
    added = backend.get_added_tokens_decoder()
    if any(not a.special or a.normalized or a.lstrip or a.rstrip or a.single_word for a in added.values()):
        return None, "an added token is not a plain special token"
    contents = [a.content for a in added.values()]
    if any(a != b and b.startswith(a) for a in contents for b in contents):
        return None, "an added token is a prefix of another"
    why = _checked_merges(bpe)
    if why:
        return None, why
    to_latin1 = str.maketrans({symbol: chr(b) for symbol, b in decoder.items()})
    ranks = {token.translate(to_latin1).encode("latin-1"): rank for token, rank in vocab.items()}
    encoding = tiktoken.Encoding("hf-bpe", pat_str=pattern, mergeable_ranks=ranks,
                                 special_tokens={a.content: i for i, a in added.items()})
    return TiktokenBPE(encoding, normalizer is not None, fallback), ""
