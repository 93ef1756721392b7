"""One chunk of records -> token arrays for every output dataset; the same code runs in every worker.

A chunk's result depends only on its records and the config, never on which process ran it, which is why
any number of workers writes identical bytes.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from ..config.loader import ConfigError
from ..config.prep import PrepConfig
from .bpe import exact_tiktoken
from .handlers import Conversation, Preference, ProcessReward, RecordError, make_handler
from .packing import IGNORE_INDEX, pack
from .templates import Renderer, load_template

INSTRUCTION_KEYS = ("input_ids", "attention_mask", "labels")


@dataclass
class Chunk:
    index: int
    records: list[tuple[int, int, Any]]
    """(source index, line, payload) in input order."""


@dataclass
class ChunkResult:
    index: int
    arrays: dict[str, tuple[np.ndarray, np.ndarray]]
    """output key -> (tokens back to back, sequence lengths)."""
    read: int = 0
    written: int = 0
    truncated: int = 0
    truncations: list[tuple[int, int, str]] = field(default_factory=list)
    """(source index, line, what was cut) of every truncated sample in the chunk."""
    tokens: int = 0
    padding: int = 0
    errors: list[tuple[int, int, str]] = field(default_factory=list)
    """(source index, line, message) of every bad record in the chunk."""


def output_keys(cfg: PrepConfig) -> list[str]:
    """The ``<key>`` of ``<prefix>_<key>_document``, MindSpeed-LLM's names."""
    if cfg.is_pretrain:
        return list(cfg.jsonKeys)
    if cfg.is_pairwise:
        return [f"packed_{side}_{k}" for side in ("chosen", "rejected") for k in INSTRUCTION_KEYS]
    return [f"packed_{k}" for k in INSTRUCTION_KEYS]


def output_dtype(cfg: PrepConfig, vocab_size: int) -> type[np.number]:
    """Megatron's rule for token data (uint16 below 65500 entries); int32 where labels hold -100."""
    if cfg.is_pretrain:
        return np.uint16 if vocab_size < 65500 else np.int32
    return np.int32


def load_tokenizer(cfg: PrepConfig):
    """A local HuggingFace tokenizer; no hub downloads. One process, one thread: parallelism is ours."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers import AutoTokenizer

    path = cfg.tokenizerNameOrPath
    if not os.path.isdir(path):
        raise ConfigError(f"tokenizerNameOrPath: {path} is not a local tokenizer directory")
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ConfigError(f"tokenizerNameOrPath: cannot load a tokenizer from {path}: {e}") from None


class TextEncoder:
    """Token ids of many texts, the ids ``tokenizer(texts)["input_ids"]`` gives. A fast tokenizer's ``__call__``
    runs its Rust backend's ``encode_batch`` and then builds a BatchEncoding (attention masks included) text by
    text; here the ids come straight from the backend, set up as ``__call__`` sets it up without truncation or
    padding, or from tiktoken where ``bpe.exact_tiktoken`` shows that it merges alike (``bpe`` says which)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
        self.backend = None if getattr(tokenizer, "split_special_tokens", False) else backend
        self.tiktoken, why = (exact_tiktoken(self.backend, self._backend_ids) if self.backend is not None
                              else (None, "not a fast tokenizer"))
        self.bpe = "tiktoken" if self.tiktoken is not None else f"huggingface ({why})"

    def _backend_ids(self, texts: list[str], add_special_tokens: bool = False) -> list[list[int]]:
        backend = self.backend
        if backend.truncation is not None:
            backend.no_truncation()
        if backend.padding is not None:
            backend.no_padding()
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=add_special_tokens)]

    def __call__(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        if not texts:
            return []
        if self.tiktoken is not None:  # its post-processor adds no tokens (checked), so add_special_tokens is moot
            return self.tiktoken.encode(texts)
        if self.backend is None:
            return self.tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]
        return self._backend_ids(texts, add_special_tokens)

    def arrays(self, texts: list[str]) -> list[np.ndarray]:
        """The same ids (special tokens added) as numpy arrays; from tiktoken without a Python int per token."""
        if self.tiktoken is not None:
            return self.tiktoken.encode(texts, arrays=True)
        return [np.asarray(ids, dtype=np.int64) for ids in self(texts)]


def split_budget(source: int, target: int, budget: int) -> tuple[int, int]:
    """How many prompt and reply tokens of one turn fit into ``budget``: a short side stays whole, otherwise
    both shrink in proportion; the reply keeps at least one token."""
    if source + target <= budget:
        return source, target
    if 2 * target <= budget:
        keep_target = target
    elif 2 * source <= budget:
        keep_target = budget - source
    else:
        keep_target = max(1, budget * target // (source + target))
    keep_target = min(keep_target, target, budget)
    return min(source, budget - keep_target), keep_target


def _cut_message(prompt: int, reply: int, kept_prompt: int, kept_reply: int, limit: int) -> str:
    """What truncation did to one sample, in tokens; a cut inside the prompt is said first (the model then
    learns replies to questions it never saw whole)."""
    where = "cut inside the prompt" if kept_prompt < prompt else "cut inside the reply"
    return (f"{where}: {prompt + reply} tokens, {limit} fit; prompt {prompt} -> {kept_prompt}, "
            f"reply {reply} -> {kept_reply} tokens")


class ChunkProcessor:
    """Everything a worker needs, built once per process: tokenizer, handler, template."""

    def __init__(self, cfg: PrepConfig, tokenizer=None):
        self.cfg = cfg
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(cfg)
        self.encode = TextEncoder(self.tokenizer)
        self.handler = make_handler(cfg)
        self.keys = output_keys(cfg)
        self.dtype = output_dtype(cfg, len(self.tokenizer))
        self.renderer = None
        self.cutoff = None
        if cfg.is_process_reward:
            self.placeholder_id = self._single_token(cfg.placeholderToken, "placeholderToken")
            self.reward_ids = {t: self._single_token(t, "rewardTokens") for t in cfg.rewardTokens}
            self.cutoff = cfg.seqLength
        elif not cfg.is_pretrain:
            tok = self.tokenizer
            self.renderer = Renderer(load_template(cfg.promptType, cfg.promptTypePath), tok.bos_token,
                                     tok.eos_token, cfg.promptType)
            vocab = tok.get_vocab()
            missing = sorted(t for t in self.renderer.special_tokens() if t not in vocab)
            if missing:
                raise ConfigError(f"promptType {cfg.promptType}: the tokenizer in {cfg.tokenizerNameOrPath} "
                                  f"lacks the template's special tokens {', '.join(missing)}")
            self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
            if cfg.packing and self.pad_id is None:
                raise ConfigError("pack: the tokenizer has neither a pad nor an eos token to pad with")
            if cfg.seqLength:
                self.cutoff = cfg.seqLength - 1 if cfg.packing else cfg.seqLength
        elif cfg.appendEod and self.tokenizer.eos_token_id is None:
            raise ConfigError(f"appendEod: the tokenizer in {cfg.tokenizerNameOrPath} has no eos token")

    def _single_token(self, text: str, field: str) -> int:
        ids = self.encode([text], add_special_tokens=False)[0]
        if len(ids) != 1:
            raise ConfigError(f"{field}: {text!r} is {len(ids)} tokens of the tokenizer in "
                              f"{self.cfg.tokenizerNameOrPath}, not one (add it to the tokenizer as a token)")
        return ids[0]

    # ------------------------------------------------------------------ records -> samples

    def _parse(self, payload: Any) -> dict:
        if isinstance(payload, bytes):
            try:
                payload = json.loads(payload)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise RecordError(f"malformed JSON: {getattr(e, 'msg', e)}") from None
        if not isinstance(payload, dict):
            raise RecordError(f"record must be a JSON object, got {type(payload).__name__}")
        return payload

    def process(self, chunk: Chunk) -> ChunkResult:
        result = ChunkResult(chunk.index, {}, read=len(chunk.records))
        samples, places = [], []
        for source, line, payload in chunk.records:
            try:
                samples.append(self.handler(self._parse(payload)))
                places.append((source, line))
            except RecordError as e:
                result.errors.append((source, line, str(e)))
        if self.cfg.is_pretrain:
            self._pretrain(samples, result)
        elif self.cfg.is_process_reward:
            self._process_reward(samples, places, result)
        else:
            self._instruction(samples, places, result)
        return result

    # ------------------------------------------------------------------ pretraining

    def _pretrain(self, samples: list[list[str]], result: ChunkResult) -> None:
        eod = np.array([self.tokenizer.eos_token_id]) if self.cfg.appendEod else None
        for k, key in enumerate(self.keys):
            docs = self.encode.arrays([s[k] for s in samples])
            lengths = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs)) + (eod is not None)
            pieces = docs if eod is None else [a for doc in docs for a in (doc, eod)]
            data = np.concatenate(pieces).astype(self.dtype) if pieces else np.empty(0, self.dtype)
            result.arrays[key] = (data, lengths)
            result.tokens += data.size
        result.written = len(samples)

    # ------------------------------------------------------------------ process reward data

    def _process_reward(self, samples: list[ProcessReward], places: list, result: ChunkResult) -> None:
        """The text's own tokens (no template, no special tokens); labels hold the step's reward token at each
        placeholder, unshifted, and -100 elsewhere. A sample is never cut: that would drop steps."""
        kept = []
        for sample, ids, place in zip(samples, self.encode([s.text for s in samples], False),
                                      places):
            at = [i for i, t in enumerate(ids) if t == self.placeholder_id]
            if len(at) != len(sample.values):
                result.errors.append((*place, f"{len(at)} placeholders {self.cfg.placeholderToken!r} in the text "
                                              f"but {len(sample.values)} labels"))
                continue
            if self.cutoff is not None and len(ids) > self.cutoff:
                result.errors.append((*place, f"sample has {len(ids)} tokens, longer than seqLength "
                                              f"{self.cfg.seqLength}"))
                continue
            labels = [IGNORE_INDEX] * len(ids)
            for i, value in zip(at, sample.values):
                labels[i] = self.reward_ids[value]
            kept.append((ids, labels))
        result.errors.sort(key=lambda e: (e[0], e[1]))
        result.written = len(kept)
        result.tokens = sum(len(ids) for ids, _ in kept)
        self._store_instruction(result, "packed_", kept)

    # ------------------------------------------------------------------ instruction and pairwise data

    def _encode_pieces(self, rendered: list) -> list:
        """Tokenize every piece of every sample in one batch call (the fast path of HF tokenizers)."""
        flat = [p for turns in rendered for src, tgt in turns for p in src + tgt]
        ids = iter(self.encode(flat, add_special_tokens=False))
        return [[([t for _ in src for t in next(ids)], [t for _ in tgt for t in next(ids)]) for src, tgt in turns]
                for turns in rendered]

    def _assemble(self, turns: list[tuple[list[int], list[int]]]) -> tuple[list[int], list[int], str | None]:
        """Prompt tokens masked with -100, replies kept; cut to the cutoff turn by turn. The third value says
        what was cut (None when nothing was)."""
        ids, labels = [], []
        for source, target in turns:
            if self.cutoff is not None and self.cfg.truncation:
                s, t = split_budget(len(source), len(target), max(0, self.cutoff - len(ids)))
                source, target = source[:s], target[:t]
            ids += source + target
            labels += [IGNORE_INDEX] * len(source) + target
        prompt = sum(len(src) for src, _ in turns)
        reply = sum(len(tgt) for _, tgt in turns)
        if len(ids) == prompt + reply:
            return ids, labels, None
        kept_reply = sum(lab != IGNORE_INDEX for lab in labels)
        return ids, labels, _cut_message(prompt, reply, len(ids) - kept_reply, kept_reply, self.cutoff)

    def _check_length(self, n: int) -> None:
        if self.cutoff is not None and n > self.cutoff:
            room = " (one token is kept for padding when packing)" if self.cfg.packing else ""
            raise RecordError(f"sample has {n} tokens, longer than seqLength {self.cfg.seqLength}{room}; "
                              "drop --no-truncation to shorten it")

    def _instruction(self, samples: list, places: list, result: ChunkResult) -> None:
        renderer = self.renderer
        rendered = []
        for sample in samples:
            conv = sample.conversation if isinstance(sample, Preference) else sample
            turns = renderer.render(conv.system, conv.turns)
            if isinstance(sample, Preference):
                turns.append(([], [renderer.assistant.replace("{content}", sample.rejected)]))
            rendered.append(turns)
        encoded = self._encode_pieces(rendered)
        if self.cfg.is_prompt_only:
            self._prompts(samples, encoded, places, result)
            return
        kept, kept_places = [], []
        for sample, turns, place in zip(samples, encoded, places):
            try:
                if isinstance(sample, Preference):
                    kept.append(self._pairwise(turns, result, place))
                else:
                    ids, labels, cut = self._assemble(turns)
                    self._check_length(len(ids))
                    if cut:
                        result.truncated += 1
                        result.truncations.append((*place, cut))
                    kept.append((ids, labels))
                kept_places.append(place)
            except RecordError as e:
                result.errors.append((*place, str(e)))
        result.errors.sort(key=lambda e: (e[0], e[1]))
        result.written = len(kept)
        if self.cfg.is_pairwise:
            for side, index in (("chosen", 0), ("rejected", 1)):
                self._store_instruction(result, f"packed_{side}_", [s[index] for s in kept])
        elif self.cfg.packing:
            sequences = pack(kept, self.cfg.seqLength, self.pad_id, self.cfg.neatPack)
            result.padding = sum(self.cfg.seqLength for _ in sequences) - sum(len(ids) for ids, _ in kept)
            result.tokens = sum(len(ids) for ids, _ in kept)
            for k, key in enumerate(self.keys):
                self._store(result, key, [s[k] for s in sequences])
        else:
            self._store_instruction(result, "packed_", kept)
            result.tokens = sum(len(ids) for ids, _ in kept)

    def _prompts(self, samples: list[Conversation], encoded: list, places: list, result: ChunkResult) -> None:
        """RL prompts (MindSpeed-RL's R1 handler): input_ids = the conversation up to the last assistant header,
        labels = the reference answer's tokens (no template, nothing masked). A prompt is never cut: one longer
        than seqLength is a bad record."""
        answers = [s.turns[-1][3] for s in samples]
        answer_ids = self.encode(answers, add_special_tokens=False)
        kept = []
        for turns, answer, place in zip(encoded, answer_ids, places):
            prompt = [t for src, tgt in turns[:-1] for t in src + tgt] + turns[-1][0]
            if self.cutoff is not None and len(prompt) > self.cutoff:
                result.errors.append((*place, f"prompt has {len(prompt)} tokens, longer than seqLength "
                                              f"{self.cfg.seqLength}"))
                continue
            kept.append((prompt, answer))
        result.errors.sort(key=lambda e: (e[0], e[1]))
        result.written = len(kept)
        result.tokens = sum(len(p) for p, _ in kept)
        self._store_instruction(result, "packed_", kept)

    def _pairwise(self, turns, result: ChunkResult, place: tuple[int, int]):
        """History and final prompt are all prompt (-100); chosen and rejected replies share one cut."""
        prompt = [t for src, tgt in turns[:-2] for t in src + tgt] + turns[-2][0]
        chosen, rejected = turns[-2][1], turns[-1][1]
        longest = max(len(chosen), len(rejected))
        if self.cutoff is not None and len(prompt) + longest > self.cutoff:
            if not self.cfg.truncation:
                self._check_length(len(prompt) + longest)
            s, t = split_budget(len(prompt), longest, self.cutoff)
            result.truncated += 1
            result.truncations.append((*place, _cut_message(len(prompt), longest, s, t, self.cutoff)))
            prompt, chosen, rejected = prompt[:s], chosen[:t], rejected[:t]
        result.tokens += 2 * len(prompt) + len(chosen) + len(rejected)
        return ((prompt + chosen, [IGNORE_INDEX] * len(prompt) + chosen),
                (prompt + rejected, [IGNORE_INDEX] * len(prompt) + rejected))

    # ------------------------------------------------------------------ arrays

    def _store(self, result: ChunkResult, key: str, sequences: list[list[int]]) -> None:
        lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
        data = np.fromiter(chain.from_iterable(sequences), dtype=self.dtype, count=int(lengths.sum()))
        result.arrays[key] = (data, lengths)

    def _store_instruction(self, result: ChunkResult, prefix: str, samples: list[tuple[list[int], list[int]]]):
        self._store(result, f"{prefix}input_ids", [ids for ids, _ in samples])
        self._store(result, f"{prefix}attention_mask", [[1] * len(ids) for ids, _ in samples])
        self._store(result, f"{prefix}labels", [labels for _, labels in samples])
