"""tiktoken in place of a HuggingFace byte-level BPE, only where it is shown at load time to give the same ids.

The HF tokenizers BPE is most of a pretraining run's work; tiktoken's is about 6x faster. Both split the text
with a regex and merge symbols pairwise; tiktoken merges the neighbours whose concatenation is the
lowest-ranked token, HF the neighbours that form the earliest entry of its merge list. ``exact_tiktoken``
builds a tiktoken ``Encoding`` from the HF tokenizer's own state and returns it only when every condition
below holds (otherwise None and the reason, and the HF path is used):

- normalizer: none or NFC (NFC text goes to tiktoken as is; any other text to HF, text by text);
- pre-tokenizer: a regex ``Split`` (isolated) then ``ByteLevel`` without its own regex and without a prefix
  space, or ``ByteLevel`` with GPT-2's regex; tiktoken gets the same pattern;
- model: BPE over byte-level symbols, all 256 bytes in the vocabulary, no dropout, no word prefix or suffix,
  no byte fallback;
- merges: every merge makes a token, in the order of the tokens' ids (merge order = rank), and the merges
  rebuild every token from its own bytes (checked with the whole-word shortcut off);
- added tokens: special, matched as written (not normalized, no lstrip/rstrip/single-word), none a prefix
  of another; the post-processor adds no tokens to a single text.

Why that is enough: inside any word, the symbols that cover one token's bytes were merged among themselves as
that token's bytes alone would be (a merge is taken when it is the lowest candidate of the word, so also of
those inside), and that sequence passes through a single two-symbol state, the token's own last merge. So two
neighbours that make a token are always that token's merge: HF has every pair tiktoken sees, both take the
lowest rank, and equal ranks are the same merge, taken leftmost first by both. A merge list with one merge
per token (as hub ``tokenizer.json`` files have) qualifies as well as one with every split (as transformers'
``TikTokenConverter`` writes). Not covered by the checks: that Oniguruma (HF) and fancy-regex (tiktoken) read
the pattern alike, and Python's and Rust's Unicode tables agree on NFC; ``tests/unit/test_prep_bpe.py``
compares on varied text, ``benchmarks/preprocess.py`` against Megatron-LM's per-document HF calls.

The merge checks take ~1 s for a 150k vocabulary; a model that passed them leaves a stamp (the sha256 of its
state) in ``~/.cache/ascend-engine/exact-bpe``, so later runs with the same tokenizer skip them.
"""
from __future__ import annotations

import hashlib
import json
import os
import unicodedata
from pathlib import Path

import numpy as np

CHECKS = b"exact-bpe 2\n"  # change it when the checks change: stamps of the old checks no longer count
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


def _merge_problem(model: dict, bpe, specials: set[str]) -> str:
    """Why these merges may not merge as tiktoken does with the vocabulary's ids as ranks ('' when they do).
    ``specials``: the added tokens as vocabulary symbols; they are cut out before any merging."""
    vocab: dict[str, int] = model["vocab"]
    last = -1
    for merge in model["merges"]:
        left, right = merge if isinstance(merge, list) else merge.split(" ")
        rank = vocab.get(left + right)
        if rank is None or rank < last:
            return "merge order is not token rank"
        last = rank
    ignore_merges = bpe.ignore_merges
    bpe.ignore_merges = False  # the merges themselves must rebuild each token, not the whole-word shortcut
    try:
        unreached = [t for t, i in vocab.items()
                     if len(t) > 1 and t not in specials and [x.id for x in bpe.tokenize(t)] != [i]]
    finally:
        bpe.ignore_merges = ignore_merges
    if unreached:
        return f"{len(unreached)} tokens are not what the merges make of their bytes (e.g. {unreached[0]!r})"
    return ""


def _checked_merges(bpe, specials: set[str]) -> str:
    """``_merge_problem`` of this BPE model, once per model: a model that passed leaves a stamp named by the
    sha256 of its whole state (vocabulary, merges, options) under ``~/.cache/ascend-engine/exact-bpe``."""
    state = bpe.__getstate__()
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    key = CHECKS + "\n".join(sorted(specials)).encode() + b"\n" + state
    stamp = Path(root, "ascend-engine", "exact-bpe", hashlib.sha256(key).hexdigest())
    if stamp.exists():
        return ""
    why = _merge_problem(json.loads(state), bpe, specials)
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

    def encode(self, texts: list[str], arrays: bool = False) -> list:
        """Lists of ids, or with ``arrays`` numpy arrays (tiktoken's own buffers, no Python ints)."""
        encode = self.encoding.encode_to_numpy if arrays else self.encoding.encode
        out, rest = [], []
        for text in texts:
            try:
                text.encode("utf-8")  # a lone surrogate: HF reports it its own way
                exact = not self.nfc or unicodedata.is_normalized("NFC", text)
            except UnicodeEncodeError:
                exact = False
            if exact:
                out.append(encode(text, allowed_special=self.allowed, disallowed_special=()))
            else:
                rest.append(len(out))
                out.append(text)
        if rest:
            for i, ids in zip(rest, self.fallback([out[i] for i in rest])):
                out[i] = np.asarray(ids, dtype=np.int64) if arrays else ids
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
    encoder = {b: symbol for symbol, b in decoder.items()}
    why = _checked_merges(bpe, {"".join(encoder[b] for b in c.encode("utf-8")) for c in contents})
    if why:
        return None, why
    to_latin1 = str.maketrans({symbol: chr(b) for symbol, b in decoder.items()})
    ranks = {token.translate(to_latin1).encode("latin-1"): rank for token, rank in vocab.items()}
    if len(set(ranks.values())) != len(ranks):
        return None, "two tokens share an id"
    try:
        encoding = tiktoken.Encoding("hf-bpe", pat_str=pattern, mergeable_ranks=ranks,
                                     special_tokens={a.content: i for i, a in added.items()})
    except ValueError as e:  # e.g. a pattern that fancy-regex does not read as Oniguruma does
        return None, f"tiktoken does not take it: {e}"
    return TiktokenBPE(encoding, normalizer is not None, fallback), ""
