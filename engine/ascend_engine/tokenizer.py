"""The tokenizer for inference commands, read straight from ``tokenizer.json`` where that file is all transformers
would use, so that ``evaluate`` and ``generate`` do not import transformers (about 1.2 s of a process's start-up).

transformers 5 loads a generic tokenizer class (``TokenizersBackend``, ``PreTrainedTokenizerFast``: Llama 3, GLM-4,
every tokenizer our tools write) from ``tokenizer.json`` as it is. It changes that tokenizer only where
``tokenizer_config.json`` asks it to: ``add_bos_token``/``add_eos_token`` replace the post-processor (both false,
as Qwen's configs say: with one that adds nothing), special tokens that the file lacks are added,
``split_special_tokens`` splits them, ``fix_mistral_regex`` replaces the split pattern, and
``clean_up_tokenization_spaces`` edits decoded text of a non-BPE model.

A family class rebuilds the pipeline from its own code and takes only the vocabulary, merges, post-processor and
added tokens from the file. ``Qwen2Tokenizer`` (every Qwen2, Qwen2.5 and Qwen3 checkpoint) is read from the file
when the file's pipeline is the one that class builds (``_builds_qwen2``), as the Qwen checkpoints' own files are;
other families (``LlamaTokenizer``...) always come from transformers. So do chat templates. The two always give
the same ids and text (``tests/unit/test_tokenizer.py`` holds them side by side).
"""
from __future__ import annotations

import json
from pathlib import Path

VERBATIM_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
QWEN2_CLASSES = ("Qwen2Tokenizer", "Qwen2TokenizerFast")  # transformers 5 maps both names to Qwen2Tokenizer
NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
REWRITING_KEYS = ("add_bos_token", "add_eos_token", "fix_mistral_regex", "split_special_tokens")  # when true
TEMPLATE_KEYS = ("add_bos_token", "add_eos_token")  # when present, even false: a post-processor of their own
# What Qwen2Tokenizer's __init__ builds: its defaults for special tokens the config leaves out, and its split
QWEN2_DEFAULT_TOKENS = {"unk_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
               r"""\s*[\r\n]+|\s+(?!\S)|\s+""")


def load_tokenizer(name_or_path: str, chat_template: bool = False):
    """``name_or_path``'s tokenizer: a ``FileTokenizer`` where transformers would use ``tokenizer.json`` unchanged
    and no chat template is needed, else transformers' ``AutoTokenizer``."""
    tokenizer = None if chat_template else FileTokenizer.read(Path(name_or_path))
    if tokenizer is not None:
        return tokenizer
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name_or_path)


def _content(token) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string or an ``AddedToken``'s dict."""
    return token.get("content") if isinstance(token, dict) else token


class FileTokenizer:
    """The part of transformers' tokenizer interface the inference commands use, over ``tokenizers.Tokenizer``."""

    def __init__(self, directory: Path, named: dict[str, str | None], tokenizer):
        self.name_or_path = str(directory)
        self.chat_template = None
        self._tokenizer = tokenizer
        tokenizer.no_padding()  # as transformers' calls without padding= or truncation=
        tokenizer.no_truncation()
        for key in NAMED_TOKENS:
            token = named.get(key)
            setattr(self, key, token)
            setattr(self, f"{key}_id", None if token is None else tokenizer.token_to_id(token))

    @classmethod
    def read(cls, directory: Path) -> FileTokenizer | None:
        """``directory``'s tokenizer, each file read once; None where transformers would not tokenize exactly as
        its ``tokenizer.json`` does (module docstring) or the files cannot be read."""
        from tokenizers import Tokenizer

        try:
            config = json.loads((directory / "tokenizer_config.json").read_text())
        except (OSError, ValueError):
            return None
        family = config.get("tokenizer_class") in QWEN2_CLASSES
        if config.get("tokenizer_class") not in VERBATIM_CLASSES and not family:
            return None
        if any(config.get(key) for key in REWRITING_KEYS) or not (directory / "tokenizer.json").is_file():
            return None
        try:
            tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception:  # not a tokenizers file: transformers' own loading says why
            return None
        if config.get("clean_up_tokenization_spaces") and type(tokenizer.model).__name__ != "BPE":
            return None
        if any(key in config for key in TEMPLATE_KEYS) and tokenizer.post_processor is not None and \
                tokenizer.post_processor.num_special_tokens_to_add(False):
            return None  # transformers' template then adds nothing, where the file's adds tokens
        added_tokens = tokenizer.get_added_tokens_decoder()
        if family and not _builds_qwen2(tokenizer, added_tokens, config):
            return None
        named = {key: _content(config.get(key)) for key in NAMED_TOKENS}
        if family:
            named.update({key: token for key, token in QWEN2_DEFAULT_TOKENS.items() if key not in config})
        added = {t.content: t.special for t in added_tokens.values()}
        extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
        specials = [*named.values(), *(_content(t) for t in (extra.values() if isinstance(extra, dict) else extra))]
        declared = [(t["content"], bool(t.get("special"))) for t in (config.get("added_tokens_decoder") or {}).values()]
        if all(added.get(token) for token in specials if token is not None) and \
                all(added.get(token) == special for token, special in declared):
            return cls(directory, named, tokenizer)
        return None

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def __call__(self, text: str | list[str], add_special_tokens: bool = True) -> dict:
        if isinstance(text, str):
            return {"input_ids": self.encode(text, add_special_tokens)}
        encoded = self._tokenizer.encode_batch(text, add_special_tokens=add_special_tokens) if text else []
        return {"input_ids": [e.ids for e in encoded]}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self._tokenizer.decode([ids] if isinstance(ids, int) else list(ids),
                                      skip_special_tokens=skip_special_tokens)

    def batch_decode(self, rows, skip_special_tokens: bool = False) -> list[str]:
        return self._tokenizer.decode_batch([list(r) for r in rows], skip_special_tokens=skip_special_tokens)


def _builds_qwen2(tokenizer, added_tokens: dict, config: dict) -> bool:
    """Whether Qwen2Tokenizer's code, given this file's vocabulary and merges, builds the file's own pipeline: a
    plain BPE, NFC, Qwen2's split then bytes, a byte-level decoder (whose flags do not change decoding; the
    pre-tokenizer's ``trim_offsets`` changes only offsets). The class takes its added tokens from the config's
    ``added_tokens_decoder`` where there is one, so that must list the file's (``added_tokens``), alike."""
    model = tokenizer.model
    if type(model).__name__ != "BPE" or model.dropout is not None or model.unk_token is not None or model.fuse_unk \
            or model.byte_fallback or model.ignore_merges or model.continuing_subword_prefix \
            or model.end_of_word_suffix:
        return False
    parts = (tokenizer.normalizer, tokenizer.pre_tokenizer, tokenizer.decoder)
    normalizer, pre_tokenizer, decoder = (None if part is None else json.loads(part.__getstate__()) for part in parts)
    if normalizer != {"type": "NFC"} or (decoder or {}).get("type") != "ByteLevel":
        return False
    split = {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": False}
    to_bytes = {"type": "ByteLevel", "add_prefix_space": bool(config.get("add_prefix_space")), "use_regex": False}
    steps = (pre_tokenizer or {}).get("pretokenizers") or []
    if (pre_tokenizer or {}).get("type") != "Sequence" or len(steps) != 2 or steps[0] != split or \
            {k: v for k, v in steps[1].items() if k != "trim_offsets"} != to_bytes:
        return False
    declared = config.get("added_tokens_decoder")
    if declared is None:
        return True
    flags = ("content", "single_word", "lstrip", "rstrip", "normalized", "special")
    return all({k: declared.get(str(i), {}).get(k) for k in flags} == {k: getattr(t, k) for k in flags}
               for i, t in added_tokens.items())
