"""``ConvertConfig``: what ``ascend-engine convert`` does and what ``CheckpointConvert.spec.convert`` holds.

The flags are MindSpeed-LLM's ``convert_ckpt.py`` flags, so an existing ``ckpt_convert_*.sh`` carries over:
``--load-model-type hf --save-model-type mg --target-tensor-parallel-size 2 ... --model-type-hf qwen3``.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from .base import EngineModel, Flag

PositiveInt = Annotated[int, Field(ge=1)]
LoraTarget = Literal["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]


class ConvertConfig(EngineModel):
    """Convert HuggingFace <-> Megatron-core checkpoints, reshard Megatron ones, merge LoRA adapters."""

    loadModelType: Annotated[Literal["hf", "mg"], Flag("--load-model-type")] = "hf"
    """Format of loadDir: hf (safetensors + config.json) or mg (Megatron-core checkpoint)."""
    saveModelType: Annotated[Literal["hf", "mg"], Flag("--save-model-type")] = "mg"
    """Format to write to saveDir."""
    loadDir: Annotated[str, Field(min_length=1), Flag("--load-dir")]
    """Checkpoint to read."""
    ckptStep: Annotated[int | None, Field(ge=0), Flag("--ckpt-step", "--load-iteration")] = None
    """Iteration of a Megatron loadDir to read (Megatron's --ckpt-step), e.g. 10 for iter_0000010; default the
    one in latest_checkpointed_iteration.txt. A Megatron output keeps this iteration number."""
    saveDir: Annotated[str, Field(min_length=1), Flag("--save-dir")]
    """Where to write the result (created; an existing HF directory must be empty)."""
    modelTypeHf: Annotated[Literal["qwen3", "qwen2", "llama2", "llama3", "qwen3_moe", "qwen2_moe", "mixtral"] | None,
                           Flag("--model-type-hf")] = None
    """Model family of the HF side; read from config.json when loading HF, required when saving HF."""
    targetTensorParallelSize: Annotated[PositiveInt, Flag("--target-tensor-parallel-size")] = 1
    """Tensor parallel size of a Megatron output."""
    targetPipelineParallelSize: Annotated[PositiveInt, Flag("--target-pipeline-parallel-size")] = 1
    """Pipeline parallel size of a Megatron output."""
    targetExpertParallelSize: Annotated[PositiveInt, Flag("--target-expert-parallel-size")] = 1
    """Expert parallel size of a Megatron output (MoE models): routed experts split over EP ranks, files
    mp_rank_TT[_PPP]_EEE."""
    numLayersPerVirtualPipelineStage: Annotated[PositiveInt | None,
                                                Flag("--num-layers-per-virtual-pipeline-stage")] = None
    """Virtual pipeline stages of a Megatron output: each PP rank's file holds model0, model1, ... chunks of this
    many layers (chunk c of rank p is virtual stage c x PP + p), as training with the same flag expects."""
    numLayerList: Annotated[list[PositiveInt] | None, Flag("--num-layer-list")] = None
    """Layers per pipeline stage for an uneven split, e.g. "11,13,19,21"; must sum to the number of layers."""
    paramsDtype: Annotated[Literal["fp32", "fp16", "bf16"] | None, Flag("--params-dtype")] = None
    """Dtype of the written weights; default keeps the source's (MindSpeed-LLM defaults to fp16, which
    silently rounds bf16 models)."""
    makeVocabSizeDivisibleBy: Annotated[PositiveInt, Flag("--make-vocab-size-divisible-by")] = 128
    """Pad the Megatron vocabulary to a multiple of this value times the target tensor parallel size."""
    paddedVocabSize: Annotated[PositiveInt | None, Flag("--padded-vocab-size")] = None
    """Exact padded vocabulary size of a Megatron output; overrides makeVocabSizeDivisibleBy."""
    loraLoad: Annotated[str | None, Flag("--lora-load")] = None
    """LoRA adapter checkpoint (Megatron layout, as LoRA fine-tuning saves it) to merge into the base weights."""
    loraR: Annotated[PositiveInt | None, Flag("--lora-r")] = None
    """LoRA rank; must match the adapter."""
    loraAlpha: Annotated[float | None, Field(gt=0), Flag("--lora-alpha")] = None
    """LoRA alpha; merged weight = W + (loraAlpha / loraR) * B @ A."""
    loraTargetModules: Annotated[list[LoraTarget] | None, Flag("--lora-target-modules")] = None
    """Modules the adapter was trained on; must match the adapter's tensors."""
    hfConfigDir: Annotated[str | None, Flag("--hf-cfg-dir")] = None
    """HF model directory whose config.json and tokenizer files are copied into an HF output
    (default: config.json generated from the checkpoint's args, tokenizer from tokenizerModel)."""
    tokenizerModel: Annotated[str | None, Flag("--tokenizer-model")] = None
    """Tokenizer file or directory; its tokenizer files are copied into an HF output."""
    maxShardSizeMb: Annotated[PositiveInt, Flag("--max-shard-size-mb")] = 5000
    """Largest safetensors shard of an HF output, in MB (HF's default is 5 GB)."""

    @field_validator("numLayerList", "loraTargetModules", mode="before")
    @classmethod
    def _split_commas(cls, value):
        """Accept MindSpeed-LLM's comma form ("11,13,19,21") as well as a YAML list."""
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list):
            return [p.strip() if isinstance(p, str) else p
                    for v in value for p in (v.split(",") if isinstance(v, str) else [v]) if p != ""]
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "ConvertConfig":
        if self.numLayerList is not None and len(self.numLayerList) != self.targetPipelineParallelSize:
            raise ValueError(f"numLayerList has {len(self.numLayerList)} entries but targetPipelineParallelSize "
                             f"is {self.targetPipelineParallelSize}")
        if self.numLayersPerVirtualPipelineStage is not None and (self.numLayerList is not None
                                                                  or self.targetPipelineParallelSize == 1):
            raise ValueError("numLayersPerVirtualPipelineStage needs targetPipelineParallelSize > 1 and no "
                             "numLayerList")
        layout = (self.targetTensorParallelSize, self.targetPipelineParallelSize, self.targetExpertParallelSize)
        if self.saveModelType == "hf" and layout != (1, 1, 1):
            raise ValueError("an HF output is not split: targetTensorParallelSize, targetPipelineParallelSize and "
                             "targetExpertParallelSize must be 1 with saveModelType hf")
        if self.loraLoad:
            missing = [n for n in ("loraR", "loraAlpha", "loraTargetModules") if getattr(self, n) is None]
            if missing:
                raise ValueError(f"loraLoad needs {', '.join(missing)}")
        if self.ckptStep is not None and self.loadModelType != "mg":
            raise ValueError("ckptStep picks an iteration of a Megatron checkpoint: it needs loadModelType mg")
        if self.loadModelType == "hf" and self.saveModelType == "hf" and not self.loraLoad:
            raise ValueError("hf -> hf converts nothing; use saveModelType mg, or loraLoad to merge an adapter")
        return self
