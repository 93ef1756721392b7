"""The tokenizer for inference commands, read straight from ``tokenizer.json`` where that file is all transformers
would use, so that ``evaluate`` and ``generate`` do not import transformers (about 1.2 s of a process's start-up).

transformers 5 loads a generic tokenizer class (``TokenizersBackend``, ``PreTrainedTokenizerFast``: Llama 3, GLM-4,
every tokenizer our tools write) from ``tokenizer.json`` as it is. It changes that tokenizer only where
``tokenizer_config.json`` asks it to: ``add_bos_token``/``add_eos_token`` rewrite the post-processor, special tokens
that the file lacks are added, ``split_special_tokens`` splits them, and ``clean_up_tokenization_spaces`` edits
decoded text of a non-BPE model. A family class (``Qwen2Tokenizer``, ``LlamaTokenizer``) rebuilds the pipeline from
its own code. In all those cases, and for a chat template, the tokenizer comes from transformers instead; so the
two always give the same ids and text (``tests/unit/test_tokenizer.py`` holds them side by side).
"""
from __future__ import annotations

import json
from pathlib import Path

VERBATIM_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
REWRITING_KEYS = ("add_bos_token", "add_eos_token")


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

    def __init__(self, directory: Path, config: dict, tokenizer):
        self.name_or_path = str(directory)
        self.chat_template = None
        self._tokenizer = tokenizer
        tokenizer.no_padding()  # as transformers' calls without padding= or truncation=
        tokenizer.no_truncation()
        for key in NAMED_TOKENS:
            token = _content(config.get(key))
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
        if config.get("tokenizer_class") not in VERBATIM_CLASSES or config.get("split_special_tokens"):
            return None
        if any(key in config for key in REWRITING_KEYS) or not (directory / "tokenizer.json").is_file():
            return None
        try:
            tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception:  # not a tokenizers file: transformers' own loading says why
            return None
        if config.get("clean_up_tokenization_spaces") and type(tokenizer.model).__name__ != "BPE":
            return None
        added = {t.content: t.special for t in tokenizer.get_added_tokens_decoder().values()}
        extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
        named = [_content(config.get(key)) for key in NAMED_TOKENS]
        named += [_content(t) for t in (extra.values() if isinstance(extra, dict) else extra)]
        declared = [(t["content"], bool(t.get("special"))) for t in (config.get("added_tokens_decoder") or {}).values()]
        if all(added.get(token) for token in named if token is not None) and \
                all(added.get(token) == special for token, special in declared):
            return cls(directory, config, tokenizer)
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
