"""MindSpeed-LLM's dataset handlers: one record (a dict) -> texts, a conversation, or a preference pair.

Field names come from ``mapKeys`` merged over each handler's defaults (MindSpeed-LLM's ``--map-keys``). A
record that cannot be used raises ``RecordError``; the caller adds the file and line.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from ..config.loader import ConfigError
from ..config.prep import PrepConfig


class RecordError(ValueError):
    """One unusable record: the message says which field and why."""


@dataclass
class Conversation:
    system: str | None
    turns: list[tuple[str, str, str, str]]
    """(prompt role, prompt text, reply role, reply text); roles user/observation and assistant/function."""


@dataclass
class Preference:
    conversation: Conversation
    """The history plus the final prompt, whose reply is the chosen one."""
    rejected: str


@dataclass
class ProcessReward:
    text: str
    """The whole text, a placeholder token after each reasoning step; no chat template is applied."""
    values: list[str]
    """One reward token per placeholder, in order."""


SHAREGPT_TAGS = {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
                 "system_tag": "system", "observation_tag": "observation", "function_tag": "function_call"}
DEFAULT_MAP_KEYS: dict[str, dict[str, Any]] = {
    "AlpacaStyleInstructionHandler": {"prompt": "instruction", "query": "input", "response": "output",
                                      "system": "system", "history": "history"},
    "AlpacaStylePairwiseHandler": {"prompt": "instruction", "query": "input", "chosen": "chosen",
                                   "rejected": "rejected", "system": "system", "history": "history"},
    "R1AlpacaStyleInstructionHandler": {"prompt": "instruction", "query": "input", "response": "output",
                                        "system": "system", "history": "history"},
    "AlpacaStyleProcessRewardHandler": {"input": "input", "value": "value"},
    "SharegptStyleInstructionHandler": {"messages": "conversations", "system": "system", "tags": SHAREGPT_TAGS},
    "SharegptStylePairwiseHandler": {"messages": "conversations", "system": "system", "chosen": "chosen",
                                     "rejected": "rejected", "tags": SHAREGPT_TAGS},
}
REQUIRED = {"prompt", "response", "messages", "chosen", "rejected", "input", "value"}


def resolve_map_keys(handler: str, given: dict[str, Any] | None) -> dict[str, Any]:
    """Defaults with the user's keys on top; unknown keys and missing required columns are config errors."""
    keys = copy.deepcopy(DEFAULT_MAP_KEYS[handler])
    for key, value in (given or {}).items():
        if key not in keys:
            raise ConfigError(f"mapKeys: unknown key {key!r} for {handler}; known: {', '.join(keys)}")
        if key == "tags":
            if not isinstance(value, dict) or set(value) - set(SHAREGPT_TAGS):
                raise ConfigError(f"mapKeys.tags: must be an object with keys from {', '.join(SHAREGPT_TAGS)}")
            keys["tags"].update(value)
        elif not isinstance(value, str):
            raise ConfigError(f"mapKeys.{key}: must be a column name (string), got {value!r}")
        else:
            keys[key] = value
    for key in REQUIRED & set(keys):
        if not keys[key]:
            raise ConfigError(f"mapKeys.{key}: {handler} needs this column")
    return keys


def _text(record: dict, column: str, what: str, required: bool) -> str | None:
    """A string field; '' for a column name means the dataset has no such column (MindSpeed's convention)."""
    value = record.get(column) if column else None
    if value is None:
        if required:
            raise RecordError(f"missing field {column!r} (mapKeys.{what})")
        return None
    if not isinstance(value, str):
        raise RecordError(f"field {column!r} (mapKeys.{what}) must be a string, got {type(value).__name__}")
    return value


def _list(record: dict, column: str, what: str, required: bool) -> list | None:
    """A list field; CSV and some parquet files hold it as a JSON string."""
    value = record.get(column) if column else None
    if value is None:
        if required:
            raise RecordError(f"missing field {column!r} (mapKeys.{what})")
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise RecordError(f"field {column!r} (mapKeys.{what}) must be a list") from None
    if not isinstance(value, (list, tuple)):
        raise RecordError(f"field {column!r} (mapKeys.{what}) must be a list, got {type(value).__name__}")
    return list(value)


def _reply(text: str | None, column: str, what: str) -> str:
    if text is None or not text.strip():
        raise RecordError(f"empty response in field {column!r} (mapKeys.{what})")
    return text


class PretrainHandler:
    """GeneralPretrainHandler: the text of each ``jsonKeys`` field."""

    def __init__(self, cfg: PrepConfig):
        self.keys = list(cfg.jsonKeys)

    def __call__(self, record: dict) -> list[str]:
        texts = []
        for key in self.keys:
            text = _text(record, key, "jsonKeys", required=True)
            if not text.strip():
                raise RecordError(f"empty text in field {key!r}")
            texts.append(text)
        return texts


class AlpacaHandler:
    """Alpaca style: the human turn is ``instruction\\ninput``; ``history`` holds earlier [prompt, reply] pairs.
    R1 style reads the same fields; its ``response`` is the reference answer the reward compares against."""

    def __init__(self, cfg: PrepConfig):
        self.keys = resolve_map_keys(cfg.handlerName, cfg.mapKeys)
        self.pairwise = cfg.is_pairwise

    def __call__(self, record: dict) -> Conversation | Preference:
        k = self.keys
        prompt = _text(record, k["prompt"], "prompt", required=True)
        query = _text(record, k["query"], "query", required=False)
        instruction = f"{prompt}\n{query}" if query else prompt
        system = _text(record, k["system"], "system", required=False)
        turns = []
        for i, pair in enumerate(_list(record, k["history"], "history", required=False) or []):
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
                raise RecordError(f"field {k['history']!r} item {i} must be a [prompt, response] pair of strings")
            turns.append(("user", pair[0], "assistant", pair[1]))
        if self.pairwise:
            chosen = _reply(_text(record, k["chosen"], "chosen", True), k["chosen"], "chosen")
            rejected = _reply(_text(record, k["rejected"], "rejected", True), k["rejected"], "rejected")
            turns.append(("user", instruction, "assistant", chosen))
            return Preference(Conversation(system, turns), rejected)
        response = _reply(_text(record, k["response"], "response", True), k["response"], "response")
        turns.append(("user", instruction, "assistant", response))
        return Conversation(system, turns)


class SharegptHandler:
    """ShareGPT style (and OpenAI ``messages`` through mapKeys.tags): alternating human/assistant messages,
    an optional leading system message, observation/function_call turns for tools."""

    def __init__(self, cfg: PrepConfig):
        self.keys = resolve_map_keys(cfg.handlerName, cfg.mapKeys)
        self.pairwise = cfg.is_pairwise
        tags = self.keys["tags"]
        self.prompt_roles = {tags["user_tag"]: "user", tags["observation_tag"]: "observation"}
        self.reply_roles = {tags["assistant_tag"]: "assistant", tags["function_tag"]: "function"}

    def _message(self, message: Any, i: int) -> tuple[str, str]:
        tags, column = self.keys["tags"], self.keys["messages"]
        if not isinstance(message, dict):
            raise RecordError(f"field {column!r} message {i} must be an object")
        role, content = message.get(tags["role_tag"]), message.get(tags["content_tag"])
        if not isinstance(content, str):
            raise RecordError(f"field {column!r} message {i} has no string {tags['content_tag']!r}")
        return role, content

    def _choice(self, record: dict, what: str) -> str:
        column = self.keys[what]
        value = record.get(column)
        if value is None:
            raise RecordError(f"missing field {column!r} (mapKeys.{what})")
        if isinstance(value, dict):
            role, value = self._message(value, 0)
            if role is not None and role not in self.reply_roles:
                raise RecordError(f"field {column!r} must be an assistant message, got role {role!r}")
        if not isinstance(value, str):
            raise RecordError(f"field {column!r} (mapKeys.{what}) must be a message or a string")
        return _reply(value, column, what)

    def __call__(self, record: dict) -> Conversation | Preference:
        column, tags = self.keys["messages"], self.keys["tags"]
        messages = [self._message(m, i) for i, m in
                    enumerate(_list(record, column, "messages", required=True))]
        system = _text(record, self.keys["system"], "system", required=False)
        if messages and messages[0][0] == tags["system_tag"]:
            system, messages = messages[0][1], messages[1:]
        expected_odd = 1 if self.pairwise else 0  # pairwise data ends with the prompt, not a reply
        if not messages or len(messages) % 2 != expected_odd:
            want = "an odd number (ending with a prompt)" if self.pairwise else "an even number (prompt/reply pairs)"
            raise RecordError(f"field {column!r} must hold {want} of messages after the system one, "
                              f"got {len(messages)}")
        roles = []
        for i, (role, content) in enumerate(messages):
            allowed = self.prompt_roles if i % 2 == 0 else self.reply_roles
            if role not in allowed:
                raise RecordError(f"field {column!r} message {i}: role {role!r} where "
                                  f"{' or '.join(map(repr, allowed))} belongs")
            if i % 2 == 1:
                _reply(content, column, f"messages[{i}]")
            roles.append(allowed[role])
        if self.pairwise:
            messages.append((tags["assistant_tag"], self._choice(record, "chosen")))
            roles.append("assistant")
            rejected = self._choice(record, "rejected")
        turns = [(roles[i], messages[i][1], roles[i + 1], messages[i + 1][1]) for i in range(0, len(messages), 2)]
        conversation = Conversation(system, turns)
        return Preference(conversation, rejected) if self.pairwise else conversation


class ProcessRewardHandler:
    """MindSpeed-LLM's AlpacaStyleProcessRewardHandler: ``input`` is the text with a placeholder after each step,
    ``value`` the list of the steps' reward tokens, each one of ``rewardTokens``. Whether the placeholders in
    the text match the labels in number is checked after tokenizing (``encode.py``)."""

    def __init__(self, cfg: PrepConfig):
        self.keys = resolve_map_keys(cfg.handlerName, cfg.mapKeys)
        self.reward_tokens = list(cfg.rewardTokens)

    def __call__(self, record: dict) -> ProcessReward:
        k = self.keys
        text = _text(record, k["input"], "input", required=True)
        if not text.strip():
            raise RecordError(f"empty text in field {k['input']!r} (mapKeys.input)")
        values = _list(record, k["value"], "value", required=True)
        for i, value in enumerate(values):
            if value not in self.reward_tokens:
                raise RecordError(f"field {k['value']!r} item {i}: {value!r} is not one of the rewardTokens "
                                  f"{self.reward_tokens}")
        return ProcessReward(text, values)


def make_handler(cfg: PrepConfig):
    if cfg.is_pretrain:
        return PretrainHandler(cfg)
    if cfg.is_process_reward:
        return ProcessRewardHandler(cfg)
    if cfg.handlerName.startswith(("Alpaca", "R1Alpaca")):
        return AlpacaHandler(cfg)
    return SharegptHandler(cfg)
