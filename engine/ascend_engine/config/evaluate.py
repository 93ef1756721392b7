"""``EvaluateConfig``: what ``ascend-engine evaluate`` reads, with MindSpeed-LLM's evaluation flag names.

No torch here: the operator embeds this model in an AscendTrainJob's ``evaluation:`` block.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from .base import EngineModel, Flag

TaskName = Literal["mmlu", "ceval", "cmmlu", "boolq", "hellaswag", "agieval", "bbh", "gsm8k", "humaneval"]


class EvaluateConfig(EngineModel):
    """Score a checkpoint on benchmarks read from local files in their published formats."""

    task: Annotated[list[TaskName], Field(min_length=1), Flag("--task")]
    """Benchmarks to run, in order. Choice tasks (mmlu, ceval, cmmlu, boolq, hellaswag, agieval) score by the
    log-likelihood of each answer; bbh, gsm8k and humaneval by greedy generation and the task's own check."""
    taskDataPath: Annotated[list[str], Field(min_length=1), Flag("--task-data-path")]
    """One data path per task, in the same order (MMLU: its ``data/test`` folder, with ``data/dev`` beside it
    for few-shot examples; CEval: its ``val`` folder; CMMLU: ``test``; jsonl tasks: a file or a folder)."""
    load: Annotated[str | None, Field(min_length=1), Flag("--load")] = None
    """A Megatron checkpoint directory (latest iteration) or a HuggingFace model directory (converted on the fly
    into a temporary Megatron checkpoint at the requested layout). In an AscendTrainJob's evaluation block it
    defaults to the checkpoint the job trains (train.checkpoint.save)."""
    tokenizerNameOrPath: Annotated[str | None, Field(min_length=1), Flag("--tokenizer-name-or-path")] = None
    """Local HuggingFace tokenizer directory (required unless ``completions`` are scored)."""
    promptType: Annotated[str, Field(min_length=1), Flag("--prompt-type")] = "empty"
    """Chat template each question is wrapped in as a user turn (a preprocess template name: qwen3, chatml,
    llama3, ...); ``empty`` (base models) keeps the plain few-shot text."""
    hfChatTemplate: Annotated[bool, Flag("--hf-chat-template")] = False
    """Wrap each question as a user turn with the tokenizer's own chat template (``apply_chat_template``, with
    the generation prompt), as MindSpeed-LLM's ``--hf-chat-template``; not together with ``promptType``."""
    shot: Annotated[int, Field(ge=0), Flag("--shot")] = 0
    """Few-shot examples put before each question, taken from the task's dev/train split."""
    fewShotTemplate: Annotated[list[str] | None, Field(min_length=1), Flag("--few-shot-template")] = None
    """MindSpeed-LLM few-shot template files (``fewshot_template/mmlu_5shot_template.json`` and its ceval, cmmlu,
    AGI, bbh and gsm8k siblings: each subject's examples, written out), one per task in the task order; ``-``
    for a task that takes its examples from its own data (``shot``). A task with a template ignores ``shot``
    and builds its prompts as MindSpeed-LLM does."""
    maxNewTokens: Annotated[int, Field(ge=1), Flag("--max-new-tokens")] = 256
    """Generation budget for generative tasks (bbh, gsm8k, humaneval)."""
    evaluationBatchSize: Annotated[int, Field(ge=1), Flag("--evaluation-batch-size")] = 8
    """Sequences per forward pass when scoring choices; questions generated together (KV-cached batch) for
    generative tasks."""
    maxEvalSamples: Annotated[int | None, Field(ge=1), Flag("--max-eval-samples")] = None
    """Evaluate at most this many questions per task (a quick look); unset: all."""
    tensorModelParallelSize: Annotated[int | None, Field(ge=1), Flag("--tensor-model-parallel-size")] = None
    """Tensor-parallel size to evaluate at; unset: the checkpoint's own (an HF directory: 1). A Megatron
    checkpoint saved at another layout is resharded on the fly."""
    pipelineModelParallelSize: Annotated[int | None, Field(ge=1), Flag("--pipeline-model-parallel-size")] = None
    """Pipeline-parallel size to evaluate at; unset: the checkpoint's own (an HF directory: 1)."""
    codeTimeoutSeconds: Annotated[float, Field(gt=0), Flag("--code-timeout")] = 10.0
    """HumanEval: wall-clock limit for running one completion with its tests."""
    codeMemoryMb: Annotated[int, Field(ge=64), Flag("--code-memory-mb")] = 1024
    """HumanEval: address-space limit of the process that runs a completion."""
    allowUnsandboxedCode: Annotated[bool, Flag("--allow-unsandboxed-code")] = False
    """HumanEval: where no sandbox can be had (neither user namespaces for bubblewrap nor Landlock), run generated
    code anyway with resource limits only. Off: such an evaluation refuses to start. The isolation that ran is
    in the log and in the results (``sandbox``)."""
    completions: Annotated[str | None, Field(min_length=1), Flag("--completions")] = None
    """HumanEval: score completions produced elsewhere instead of generating (OpenAI human-eval's jsonl, one
    ``{"task_id", "completion"}`` per line, any number of samples per task); reports pass@k. No checkpoint or
    tokenizer needed."""
    resultsPath: Annotated[str | None, Flag("--results-path")] = None
    """Where the JSON report goes; unset: ``evaluation_results.json`` inside the checkpoint directory."""
    device: Annotated[Literal["auto", "npu", "cuda", "cpu"], Flag("--device")] = "auto"
    """Accelerator backend."""
    seed: Annotated[int, Flag("--seed")] = 1234
    """Seed for Megatron's RNG set-up (evaluation itself is deterministic)."""

    @model_validator(mode="after")
    def _paths_match_tasks(self):
        if len(self.taskDataPath) != len(self.task):
            raise ValueError(f"taskDataPath has {len(self.taskDataPath)} entries for {len(self.task)} tasks "
                             "(give one data path per task, in the same order)")
        if self.fewShotTemplate is not None and len(self.fewShotTemplate) != len(self.task):
            raise ValueError(f"fewShotTemplate has {len(self.fewShotTemplate)} entries for {len(self.task)} tasks "
                             "(give one per task, in the same order; '-' for none)")
        if self.hfChatTemplate and self.promptType != "empty":
            raise ValueError(f"hfChatTemplate: the tokenizer's chat template and promptType {self.promptType!r} "
                             "both wrap the question; choose one")
        if self.completions and self.task != ["humaneval"]:
            raise ValueError("completions: scoring supplied completions needs task [humaneval] alone")
        if not self.completions and not self.tokenizerNameOrPath:
            raise ValueError("tokenizerNameOrPath is required to generate answers (--tokenizer-name-or-path; only "
                             "scoring supplied completions goes without)")
        return self
