"""Chat templates as data: built-ins in ``chat_templates/<name>.json``, users' own in a JSON/YAML file.

A template is a handful of strings with ``{content}``, ``{bos}`` and ``{eos}`` placeholders. A conversation
renders into turns of (prompt pieces, reply pieces); each piece is tokenized on its own, so special tokens
such as ``<|im_end|>`` never merge with the text around them (as MindSpeed-LLM / LLaMA-Factory encode).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from pydantic import ValidationError

from ..config.base import EngineModel
from ..config.loader import ConfigError, format_validation_error
from ..config.prep import BUILTIN_TEMPLATE_DIR

SPECIAL_TOKEN = re.compile(r"<\|[^|<>\s]+\|>")


class ChatTemplate(EngineModel):
    """One chat format. Placeholders: {content} (the message), {bos} and {eos} (the tokenizer's tokens)."""

    description: str = ""
    """What the template is for."""
    prefix: str = ""
    """Text once at the very start of a conversation (e.g. '{bos}')."""
    system: str = "{content}"
    """A system prompt."""
    user: str
    """A user message, including the header that opens the assistant's reply."""
    assistant: str
    """An assistant reply, including its end-of-turn token (these tokens are trained on)."""
    observation: str | None = None
    """A tool result (ShareGPT 'observation'); default: as a user message."""
    function: str | None = None
    """A tool call (ShareGPT 'function_call'); default: as an assistant reply."""
    separator: str = ""
    """Text between a reply and the next user message."""
    defaultSystem: str = ""
    """System prompt used when a record has none."""
    systemInUser: bool = False
    """Put the rendered system prompt at the start of the first user message's content (Llama 2)."""


def load_template(name: str, path: str | None) -> ChatTemplate:
    """The template ``name`` from the user's file (if given and it defines the name), else a built-in."""
    if path:
        source = Path(path)
        try:
            text = source.read_text()
            table = json.loads(text) if source.suffix == ".json" else yaml.safe_load(text)
        except (OSError, ValueError, yaml.YAMLError) as e:
            raise ConfigError(f"{path}: cannot read prompt templates: {e}") from None
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: prompt templates must be a mapping of name -> template")
        if name in table:
            try:
                return ChatTemplate.model_validate(table[name])
            except ValidationError as e:
                raise ConfigError(format_validation_error(e, path, prefix=(name,))) from None
    builtin = BUILTIN_TEMPLATE_DIR / f"{name}.json"
    if not builtin.is_file():
        known = sorted(p.stem for p in BUILTIN_TEMPLATE_DIR.glob("*.json"))
        where = f" nor in {path}" if path else ""
        raise ConfigError(f"promptType: unknown template {name!r}{where}; built-in: {', '.join(known)}")
    return ChatTemplate.model_validate_json(builtin.read_text())


class Renderer:
    """A template bound to a tokenizer's BOS/EOS text; turns a conversation into prompt/reply pieces."""

    def __init__(self, template: ChatTemplate, bos: str | None, eos: str | None, name: str = "template"):
        def bind(text: str) -> str:
            for placeholder, token in (("{bos}", bos), ("{eos}", eos)):
                if placeholder in text:
                    if not token:
                        raise ConfigError(f"promptType {name}: uses {placeholder} but the tokenizer has none")
                    text = text.replace(placeholder, token)
            return text

        self.prefix = bind(template.prefix)
        self.system = bind(template.system)
        self.user = bind(template.user)
        self.assistant = bind(template.assistant)
        self.observation = bind(template.observation or template.user)
        self.function = bind(template.function or template.assistant)
        self.separator = bind(template.separator)
        self.default_system = template.defaultSystem
        self.system_in_user = template.systemInUser

    def special_tokens(self) -> set[str]:
        """``<|...|>`` markers the template relies on; each must be one token of the tokenizer."""
        texts = (self.prefix, self.system, self.user, self.assistant, self.observation, self.function,
                 self.separator)
        return {m for t in texts for m in SPECIAL_TOKEN.findall(t)}

    @staticmethod
    def _fill(slot: str, content: str) -> str:
        return slot.replace("{content}", content)

    def render(self, system: str | None, turns: list[tuple[str, str, str, str]]) -> list[tuple[list[str], list[str]]]:
        """``turns`` are (prompt role, prompt text, reply role, reply text); roles 'user'/'observation' and
        'assistant'/'function'. Returns per turn the prompt pieces and the reply pieces."""
        system = system if system else self.default_system
        out = []
        for i, (prompt_role, prompt, reply_role, reply) in enumerate(turns):
            pieces = []
            if i == 0:
                pieces.append(self.prefix)
                if system and self.system_in_user:
                    prompt = self._fill(self.system, system) + prompt
                elif system:
                    pieces.append(self._fill(self.system, system))
            else:
                pieces.append(self.separator)
            pieces.append(self._fill(self.observation if prompt_role == "observation" else self.user, prompt))
            reply_slot = self.function if reply_role == "function" else self.assistant
            out.append(([p for p in pieces if p], [self._fill(reply_slot, reply)]))
        return out
