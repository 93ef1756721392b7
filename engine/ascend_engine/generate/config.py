"""``GenerateConfig``: what ``ascend-engine generate`` reads (no torch here)."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ..config.base import EngineModel, Flag


class GenerateConfig(EngineModel):
    """Continue a prompt with a Megatron checkpoint, at the tensor/pipeline layout it was saved with."""

    load: Annotated[str, Field(min_length=1), Flag("--load")]
    """Megatron checkpoint directory (latest iteration); its args give the model shape and layout."""
    tokenizerNameOrPath: Annotated[str, Field(min_length=1), Flag("--tokenizer-name-or-path")]
    """Local HuggingFace tokenizer directory."""
    prompt: Annotated[str, Flag("--prompt")] = ""
    """Text to continue."""
    maxNewTokens: Annotated[int, Field(ge=1), Flag("--max-new-tokens")] = 32
    """Tokens to generate (stops early at the tokenizer's end-of-sequence token)."""
    topP: Annotated[float | None, Field(gt=0, le=1), Flag("--top-p")] = None
    """Nucleus sampling: sample among the most likely tokens whose probabilities sum to topP; unset is greedy."""
    temperature: Annotated[float, Field(gt=0), Flag("--temperature")] = 1.0
    """Softmax temperature for sampling."""
    seed: Annotated[int, Flag("--seed")] = 1234
    """Sampling seed (the same on every rank, so all ranks pick the same token)."""
    kvCache: Annotated[bool, Flag("--no-kv-cache", invert=True)] = True
    """Keep attention keys/values between steps (megatron-core's static inference context); off recomputes the
    whole sequence for every new token (same tokens, slower; a reference for checking)."""
    device: Annotated[Literal["auto", "npu", "cuda", "cpu"], Flag("--device")] = "auto"
    """Accelerator backend."""
