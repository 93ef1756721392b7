"""``PrepConfig``: what ``ascend-engine preprocess`` runs and what ``DatasetPrep.spec.prep`` holds.

Flags are MindSpeed-LLM's ``preprocess_data.py`` names, so a data-conversion script carries over one to one.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from .base import EngineModel, Flag

PositiveInt = Annotated[int, Field(ge=1)]

HandlerName = Literal[
    "GeneralPretrainHandler",
    "AlpacaStyleInstructionHandler",
    "SharegptStyleInstructionHandler",
    "AlpacaStylePairwiseHandler",
    "SharegptStylePairwiseHandler",
    "R1AlpacaStyleInstructionHandler",
    "AlpacaStyleProcessRewardHandler",
]

PRETRAIN_HANDLERS = ("GeneralPretrainHandler",)
PAIRWISE_HANDLERS = ("AlpacaStylePairwiseHandler", "SharegptStylePairwiseHandler")
# Prompts for reinforcement learning: the rendered prompt (up to the assistant header) and the reference answer.
PROMPT_HANDLERS = ("R1AlpacaStyleInstructionHandler",)
# Process reward data: raw text with a placeholder token after each step, one reward token per placeholder.
PROCESS_REWARD_HANDLERS = ("AlpacaStyleProcessRewardHandler",)

# The built-in chat templates are data files shipped next to the preprocessing code.
BUILTIN_TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "prep" / "chat_templates"


def builtin_prompt_types() -> list[str]:
    return sorted(p.stem for p in BUILTIN_TEMPLATE_DIR.glob("*.json"))


class PrepConfig(EngineModel):
    """Raw records (jsonl, json, parquet, csv, txt, arrow) -> Megatron indexed dataset, MindSpeed-LLM file names."""

    input: Annotated[str, Flag("--input")]
    """A file or a directory of files of one format: .jsonl, .json, .parquet, .csv, .txt or .arrow."""
    tokenizerNameOrPath: Annotated[str, Flag("--tokenizer-name-or-path")]
    """Local HuggingFace tokenizer directory (tokenizer.json / tokenizer_config.json)."""
    tokenizerType: Annotated[Literal["PretrainedFromHF"], Flag("--tokenizer-type")] = "PretrainedFromHF"
    """Tokenizer kind; only HuggingFace tokenizers (PretrainedFromHF) are supported."""
    outputPrefix: Annotated[str, Flag("--output-prefix")]
    """Path prefix of the outputs: <prefix>_text_document.{bin,idx} (pretrain) or
    <prefix>_packed_{input_ids,attention_mask,labels}_document.{bin,idx} (instruction data)."""
    handlerName: Annotated[HandlerName, Flag("--handler-name")] = "GeneralPretrainHandler"
    """How records become samples: pretraining text, Alpaca or ShareGPT/OpenAI instructions, pairwise
    (chosen/rejected) preference data, or R1-style RL prompts (R1AlpacaStyleInstructionHandler: input_ids is
    the prompt rendered up to the assistant header, labels the tokens of the reference answer), or process
    reward data (AlpacaStyleProcessRewardHandler: the record's text as is, labels the reward token at each
    placeholder and -100 elsewhere)."""
    jsonKeys: Annotated[list[str], Field(min_length=1), Flag("--json-keys")] = ["text"]
    """Pretraining: the record fields to tokenize, one output dataset per key."""
    mapKeys: Annotated[dict[str, Any] | None, Flag("--map-keys")] = None
    """Record field names, MindSpeed-LLM's JSON syntax, merged over the handler's defaults. Alpaca:
    {"prompt","query","response","system","history"} (pairwise: "chosen","rejected" instead of "response");
    ShareGPT/OpenAI: {"messages","system","tags":{"role_tag","content_tag","user_tag","assistant_tag",
    "system_tag","observation_tag","function_tag"}}; process reward: {"input","value"}."""
    promptType: Annotated[str | None, Flag("--prompt-type")] = None
    """Chat template name for instruction data: a built-in (qwen, qwen_r1, chatml, qwen3, llama3, llama2, empty) or one
    defined in promptTypePath. Use 'empty' when the records already carry their template."""
    promptTypePath: Annotated[str | None, Flag("--prompt-type-path")] = None
    """A JSON or YAML file with your own templates, {name: template}; looked up before the built-ins."""
    seqLength: Annotated[PositiveInt | None, Flag("--seq-length")] = None
    """Longest sample in tokens (instruction data): longer samples are truncated (or rejected with
    truncation off); packed sequences have exactly this length."""
    truncation: Annotated[bool, Flag("--no-truncation", invert=True)] = True
    """Shorten samples longer than seqLength (prompt and response in proportion, later turns first dropped).
    Off: such a sample is an error handled by onError."""
    pack: Annotated[bool, Flag("--pack")] = False
    """Concatenate samples into sequences of exactly seqLength (greedy fit within a chunk, padding at the end)."""
    neatPack: Annotated[bool, Flag("--neat-pack")] = False
    """Packing that keeps samples apart: the attention mask holds the sample number (1..k), 0 for padding.
    Implies pack."""
    appendEod: Annotated[bool, Flag("--append-eod")] = False
    """Pretraining: append the tokenizer's end-of-document token to every document."""
    workers: Annotated[PositiveInt, Flag("--workers")] = 1
    """Tokenizer processes; the output is identical for any number."""
    nSubs: Annotated[PositiveInt, Flag("--n-subs")] = 1
    """Chunks queued ahead per worker (MindSpeed splits the input into this many parts; here the input is
    already split into chunks, so this only deepens the pipeline). Memory grows with workers x nSubs chunks."""
    chunkSize: Annotated[PositiveInt, Flag("--chunk-size")] = 1000
    """Records per unit of work. Packing groups samples within one chunk, so packed output depends on it."""
    logInterval: Annotated[PositiveInt, Flag("--log-interval")] = 1000
    """Print a progress line each time this many more records are done (at most once per chunk)."""
    onError: Annotated[Literal["fail", "skip"], Flag("--on-error")] = "fail"
    """Bad records (malformed JSON, missing mapped keys, empty response, over-long sample): stop the run with
    no output, or skip them and count them in the manifest."""
    placeholderToken: Annotated[str, Flag("--placeholder-token")] = "ки"
    """Process reward data: the token that ends each reasoning step; the model is trained at its positions.
    It must be one token of the tokenizer."""
    rewardTokens: Annotated[list[str], Flag("--reward-tokens")] = []
    """Process reward data: the tokens a step's label may be (e.g. + and -), each one token of the tokenizer."""
    maxReportedErrors: Annotated[PositiveInt, Flag("--max-reported-errors")] = 20
    """How many bad records are listed by file and line; all of them are counted."""

    @field_validator("mapKeys", mode="before")
    @classmethod
    def _map_keys_json(cls, value: Any) -> Any:
        """The CLI passes MindSpeed's JSON string; YAML passes a mapping."""
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"not valid JSON ({e.msg} at column {e.colno}): {value}") from None
            if not isinstance(value, dict):
                raise ValueError(f"must be a JSON object, got {type(value).__name__}")
        return value

    @property
    def packing(self) -> bool:
        return self.pack or self.neatPack

    @property
    def is_pretrain(self) -> bool:
        return self.handlerName in PRETRAIN_HANDLERS

    @property
    def is_pairwise(self) -> bool:
        return self.handlerName in PAIRWISE_HANDLERS

    @property
    def is_prompt_only(self) -> bool:
        return self.handlerName in PROMPT_HANDLERS

    @property
    def is_process_reward(self) -> bool:
        return self.handlerName in PROCESS_REWARD_HANDLERS

    @model_validator(mode="after")
    def _consistent(self) -> "PrepConfig":
        if self.is_process_reward:
            if not self.rewardTokens:
                raise ValueError(f"rewardTokens is required for {self.handlerName} (e.g. --reward-tokens + -)")
            if self.packing:
                raise ValueError(f"{self.handlerName} writes one sample per record; it cannot be packed")
            if self.appendEod:
                raise ValueError(f"appendEod applies to GeneralPretrainHandler, not {self.handlerName}")
            return self
        if self.is_pretrain:
            if self.packing:
                raise ValueError("pack/neatPack apply to instruction data, not GeneralPretrainHandler")
            return self
        if self.appendEod:
            raise ValueError(f"appendEod applies to GeneralPretrainHandler, not {self.handlerName}")
        if self.promptType is None:
            raise ValueError(f"promptType is required for {self.handlerName} "
                             "(use 'empty' when the records already carry their chat template)")
        if self.promptTypePath is None and self.promptType not in builtin_prompt_types():
            raise ValueError(f"unknown promptType {self.promptType!r}; built-in: {', '.join(builtin_prompt_types())} "
                             "(or define it in promptTypePath)")
        if self.packing and self.seqLength is None:
            raise ValueError("pack/neatPack need seqLength")
        if self.packing and self.is_pairwise:
            raise ValueError("pairwise data cannot be packed")
        if self.packing and self.is_prompt_only:
            raise ValueError(f"{self.handlerName} writes one prompt per sample; it cannot be packed")
        return self
