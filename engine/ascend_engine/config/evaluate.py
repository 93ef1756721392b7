"""``EvaluateConfig``: what ``ascend-engine evaluate`` reads, with MindSpeed-LLM's evaluation flag names.

No torch here: the operator embeds this model in an AscendTrainJob's ``evaluation:`` block.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from .base import EngineModel, Flag

TaskName = Literal["mmlu", "ceval", "cmmlu", "boolq", "hellaswag", "agieval", "bbh", "gsm8k", "humaneval"]
NATIVE_TASKS: tuple[str, ...] = TaskName.__args__
LM_EVAL_PREFIX = "lm-eval:"


class EvaluateConfig(EngineModel):
    """Score a checkpoint on benchmarks read from local files in their published formats."""

    task: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1), Flag("--task")]
    """Benchmarks to run, in order: our task names or lm-evaluation-harness task and group names (see backend).
    Our own tasks (mmlu, ceval, cmmlu, boolq, hellaswag, agieval, bbh, gsm8k,
    humaneval: choice tasks by the log-likelihood of each answer, the others by greedy generation and the task's
    own check) read ``taskDataPath``. Any lm-evaluation-harness task or group name runs lm-eval's own task
    definition on this model (``backend: lm-eval``): a name that is not one of ours, or any name written
    ``lm-eval:<name>`` (``lm-eval:mmlu`` is lm-eval's MMLU, ``mmlu`` ours)."""
    backend: Annotated[Literal["native", "lm-eval"] | None, Flag("--backend")] = None
    """Who defines the tasks: ``native`` (ours, reading ``taskDataPath``) or ``lm-eval`` (lm-evaluation-harness's
    task definitions, prompts and metrics, with this model as its backend). Unset: ``native`` when every task is
    one of ours, ``lm-eval`` when none is or every one is written ``lm-eval:<name>``; one run uses one backend."""
    taskDataPath: Annotated[list[str] | None, Field(min_length=1), Flag("--task-data-path")] = None
    """Our tasks: one data path per task, in the same order (MMLU: its ``data/test`` folder, with ``data/dev``
    beside it for few-shot examples; CEval: its ``val`` folder; CMMLU: ``test``; jsonl tasks: a file or a
    folder). Not used by lm-eval tasks (their YAML names their data)."""
    includePath: Annotated[list[str] | None, Field(min_length=1), Flag("--include-path")] = None
    """lm-eval: folders of extra task YAML files (lm-eval's ``--include_path``), such as tasks whose
    ``dataset_kwargs.data_files`` name local json/csv/parquet files. lm-eval's built-in tasks read ``datasetsDir``
    or the local HuggingFace datasets cache (``HF_DATASETS_CACHE``); the hub is never asked
    (``HF_DATASETS_OFFLINE``)."""
    datasetsDir: Annotated[str | None, Field(min_length=1), Flag("--datasets-dir")] = None
    """lm-eval: a folder of local copies of hub datasets under their hub names (``<datasetsDir>/cais/mmlu``,
    ``<datasetsDir>/Rowan/hellaswag``, ``<datasetsDir>/openai/gsm8k``: what each task's ``dataset_path`` names),
    each a folder ``datasets.load_dataset`` reads (as ``huggingface-cli download --repo-type dataset <name>
    --local-dir <datasetsDir>/<name>`` writes it). Every task whose dataset is a hub name reads it from there; one
    that is missing fails before the model loads. Unset: the local datasets cache (``HF_DATASETS_CACHE``)."""
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
    """Few-shot examples put before each question, taken from the task's dev/train split (lm-eval:
    ``num_fewshot``; unset there, each task's own default)."""
    fewShotTemplate: Annotated[list[str] | None, Field(min_length=1), Flag("--few-shot-template")] = None
    """MindSpeed-LLM few-shot template files (``fewshot_template/mmlu_5shot_template.json`` and its ceval, cmmlu,
    AGI, bbh and gsm8k siblings: each subject's examples, written out), one per task in the task order; ``-``
    for a task that takes its examples from its own data (``shot``). A task with a template ignores ``shot``
    and builds its prompts as MindSpeed-LLM does."""
    maxNewTokens: Annotated[int, Field(ge=1), Flag("--max-new-tokens")] = 256
    """Generation budget for generative tasks (bbh, gsm8k, humaneval; lm-eval: where a task's
    ``generation_kwargs`` name no ``max_gen_toks``)."""
    evaluationBatchSize: Annotated[int, Field(ge=1), Flag("--evaluation-batch-size")] = 8
    """Sequences per forward pass when scoring choices; questions generated together (KV-cached batch) for
    generative tasks."""
    maxEvalSamples: Annotated[int | None, Field(ge=1), Flag("--max-eval-samples")] = None
    """Evaluate at most this many questions per task (a quick look; lm-eval's ``limit``); unset: all."""
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
    bootstrapIters: Annotated[int, Field(ge=0), Flag("--bootstrap-iters")] = 100000
    """lm-eval: resamples for the standard errors of metrics without a closed form (perplexities, BLEU, ...);
    0 skips them. lm-eval's own default."""
    resultsPath: Annotated[str | None, Flag("--results-path")] = None
    """Where the JSON report goes; unset: ``evaluation_results.json`` inside the checkpoint directory. lm-eval
    runs write lm-eval's results document there and each task's samples beside it
    (``<name>_samples_<task>.jsonl``)."""
    device: Annotated[Literal["auto", "npu", "cuda", "cpu"], Flag("--device")] = "auto"
    """Accelerator backend."""
    seed: Annotated[int, Flag("--seed")] = 1234
    """Seed for Megatron's RNG set-up (evaluation itself is deterministic)."""

    @property
    def uses_lm_eval(self) -> bool:
        """Whether lm-evaluation-harness defines this run's tasks (the rule in ``backend``)."""
        if self.backend is not None:
            return self.backend == "lm-eval"
        return not any(t in NATIVE_TASKS for t in self.task)

    @property
    def lm_eval_tasks(self) -> list[str]:
        """The task names as lm-eval knows them (``lm-eval:`` dropped)."""
        return [t[len(LM_EVAL_PREFIX):] if t.startswith(LM_EVAL_PREFIX) else t for t in self.task]

    @model_validator(mode="after")
    def _paths_match_tasks(self):
        prefixed = [t for t in self.task if t.startswith(LM_EVAL_PREFIX)]
        if self.backend is None and any(t in NATIVE_TASKS for t in self.task) \
                and any(t not in NATIVE_TASKS for t in self.task):
            others = [t for t in self.task if t not in NATIVE_TASKS]
            raise ValueError(f"task: {', '.join(others)} are lm-eval tasks and the others are ours; one run uses one "
                             "backend: set backend: lm-eval (every name lm-eval's) or list only our tasks "
                             f"({', '.join(NATIVE_TASKS)})")
        if self.backend == "native" and (prefixed or any(t not in NATIVE_TASKS for t in self.task)):
            raise ValueError(f"task: backend native runs only our tasks ({', '.join(NATIVE_TASKS)}); "
                             f"{', '.join(t for t in self.task if t not in NATIVE_TASKS)} need backend: lm-eval")
        if self.uses_lm_eval:
            for name, value in (("taskDataPath", self.taskDataPath), ("fewShotTemplate", self.fewShotTemplate),
                                ("completions", self.completions)):
                if value is not None:
                    raise ValueError(f"{name}: for our own tasks only; lm-eval tasks name their data in their YAML "
                                     "(includePath for local task files)")
            if self.promptType != "empty":
                raise ValueError("promptType: lm-eval tasks take no preprocess template; hfChatTemplate applies the "
                                 "tokenizer's chat template (lm-eval's --apply_chat_template)")
            if not self.tokenizerNameOrPath:
                raise ValueError("tokenizerNameOrPath is required (--tokenizer-name-or-path)")
            return self
        if self.includePath is not None:
            raise ValueError("includePath: lm-eval task folders; our own tasks read taskDataPath")
        if self.datasetsDir is not None:
            raise ValueError("datasetsDir: hub datasets for lm-eval tasks; our own tasks read taskDataPath")
        if self.taskDataPath is None:
            raise ValueError("taskDataPath: our tasks read local files, one path per task (--task-data-path)")
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
