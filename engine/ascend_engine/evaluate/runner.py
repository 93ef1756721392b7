"""One evaluation run: resolve the checkpoint (converting an HF directory or resharding a Megatron one into a
temporary folder on rank 0), load this rank's stage, run every task (each data-parallel replica on its share of
the questions), report on global rank 0."""
from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from ..config.evaluate import EvaluateConfig
from .questions import ChoiceQuestion, TaskDataError


def _is_hf_directory(path: str) -> bool:
    from ..checkpoint.layout import read_latest

    return (Path(path) / "config.json").is_file() and read_latest(path) is None


def _layout(cfg: EvaluateConfig) -> tuple[bool, int, int, tuple[int, int] | None]:
    """(needs conversion, TP, PP, the checkpoint's own layout or None for HF)."""
    from ..generate.loading import not_loadable, read_args

    if _is_hf_directory(cfg.load):
        return True, cfg.tensorModelParallelSize or 1, cfg.pipelineModelParallelSize or 1, None
    if not Path(cfg.load).is_dir():
        from ..checkpoint.training import CheckpointMismatch

        raise CheckpointMismatch(f"load: {cfg.load}: no such directory")
    _, args = read_args(cfg.load)
    saved = int(args.tensor_model_parallel_size), int(args.pipeline_model_parallel_size)
    tp, pp = cfg.tensorModelParallelSize or saved[0], cfg.pipelineModelParallelSize or saved[1]
    # an expert-parallel or virtual-pipeline checkpoint is converted on the fly like another TP/PP layout
    return (tp, pp) != saved or not_loadable(args) is not None, tp, pp, saved


def _convert(cfg: EvaluateConfig, tp: int, pp: int, hf: bool, rank: int) -> str:
    """Rank 0 converts into a fresh temporary folder; every rank gets its path."""
    import torch

    path = [None]
    if rank == 0:
        from ..cli import main

        target = tempfile.mkdtemp(prefix="ascend-eval-ckpt-")
        argv = ["convert", "--load-dir", cfg.load, "--save-dir", target, "--target-tensor-parallel-size", str(tp),
                "--target-pipeline-parallel-size", str(pp)]
        if not hf:
            argv += ["--load-model-type", "mg", "--save-model-type", "mg"]
        print(f"[evaluate] converting {cfg.load} to TP{tp} PP{pp} in {target}", file=sys.stderr, flush=True)
        path[0] = target if main(argv) == 0 else ""
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        torch.distributed.broadcast_object_list(path, src=0)
    if not path[0]:
        from ..checkpoint.training import CheckpointMismatch

        raise CheckpointMismatch(f"load: {cfg.load}: conversion to TP{tp} PP{pp} failed (see above)")
    return path[0]


def check_vocabulary(tokenizer, vocab_size: int, load: str, tokenizer_path: str) -> None:
    from ..checkpoint.training import CheckpointMismatch

    if len(tokenizer) > vocab_size:
        raise CheckpointMismatch(f"the tokenizer {tokenizer_path} has {len(tokenizer)} tokens but the checkpoint "
                                 f"{load} has a vocabulary of {vocab_size}: they do not belong together")


def evaluate(cfg: EvaluateConfig) -> list[dict] | None:
    """Run every task; the results on global rank 0 (None elsewhere). Collective over the torchrun world."""
    from ..device import select_backend
    from ..telemetry import say, started_up

    started = time.perf_counter()
    backend = select_backend(cfg.device)
    say("evaluate", f"importing Megatron-core and setting up the {backend.name} device", started)
    backend.apply()
    from ..generate.loading import load_model, read_args
    from ..parallel import destroy_parallel, init_parallel
    from ..prep.templates import load_template
    from ..telemetry import Progress
    from ..tokenizer import load_tokenizer
    from .model import InferenceModel
    from .report import format_table, status_summary, task_result, write_json, report_to_termination_message
    from .sandbox import humaneval_program, require_isolation, run_program
    from .scoring import Prompter, choice_outcomes, generate_answers, open_outcomes, score_choices
    from .sharding import gather, share
    from .tasks import load_task

    # Read every task before anything heavy, so bad data fails in a second.
    tasks, manager = [], None
    say("evaluate", f"reading {len(cfg.task)} task(s): {', '.join(cfg.task)}", started)
    if cfg.uses_lm_eval:  # lm-eval's own task definitions (evaluate/harness_tasks.py): names checked here
        from .harness_tasks import offline, task_manager, use_local_datasets

        offline()
        manager = use_local_datasets(task_manager(cfg), cfg)
    templates = [None if t == "-" else t for t in cfg.fewShotTemplate or ["-"] * len(cfg.task)]
    for task, path, template_path in zip(cfg.task, cfg.taskDataPath or [], templates):
        questions = load_task(task, path, cfg.shot, template_path)
        if not questions:
            raise TaskDataError(f"{path}: no {task} questions")
        tasks.append((task, questions[: cfg.maxEvalSamples] if cfg.maxEvalSamples else questions))
    template = load_template(cfg.promptType, None)
    # Generated code runs only where a sandbox holds (or the user opted out): known before the model loads.
    isolation = require_isolation(cfg.allowUnsandboxedCode) if "humaneval" in cfg.task and manager is None else None
    if isolation is not None:
        print(f"[evaluate] humaneval: generated code runs under {isolation.describe()}", file=sys.stderr, flush=True)
    convert, tp, pp, _ = _layout(cfg)
    say("evaluate", f"joining the process group: TP {tp} x PP {pp}", started)
    info = init_parallel(backend, tp, pp, cfg.seed)
    root = cfg.load
    try:
        if convert:
            root = _convert(cfg, tp, pp, _is_hf_directory(cfg.load), info.rank)
        say("evaluate", f"loading the model from {root}", started)
        iteration, args = read_args(root)
        model_cfg, gpt, max_len = load_model(root, iteration, args, info.tp_rank, info.pp_rank, backend.torch_device)
        # lm-eval and a chat template take transformers' tokenizer; else it is often tokenizer.json alone
        tokenizer = load_tokenizer(cfg.tokenizerNameOrPath, chat_template=manager is not None or cfg.hfChatTemplate)
        check_vocabulary(tokenizer, model_cfg.vocabSize, cfg.load, cfg.tokenizerNameOrPath)
        model = InferenceModel(gpt, model_cfg.vocabSize, max_len, info, backend.torch_device)
        if manager is not None:
            from .harness import run

            started_up()
            return run(cfg, manager, model, tokenizer, info)
        prompter = Prompter(tokenizer, template, cfg.hfChatTemplate)
        rank0 = info.rank == 0
        results = []
        started_up()  # each task's progress line speaks from here on
        for task, questions in tasks:
            # choice questions by option likelihood, open ones (AGIEval's cloze too) by generation
            choice = [q for q in questions if isinstance(q, ChoiceQuestion)]
            open_ = [q for q in questions if not isinstance(q, ChoiceQuestion)]
            say("evaluate", f"{task}: {len(questions)} questions", started)
            progress = Progress(f"evaluate {task}", total=len(share(choice, info.dp_rank, info.dp))
                                + len(share(open_, info.dp_rank, info.dp)), unit="questions", interval_s=5.0,
                                enabled=rank0)
            start, model.truncated = time.perf_counter(), 0
            outcomes = []
            if choice:
                scored = score_choices(model, prompter, share(choice, info.dp_rank, info.dp),
                                       cfg.evaluationBatchSize, progress)
                outcomes += choice_outcomes(choice, gather(scored, info.dp))
            if open_:
                completions = generate_answers(model, prompter, share(open_, info.dp_rank, info.dp),
                                               cfg.maxNewTokens, cfg.evaluationBatchSize, progress)
                completions = gather(completions, info.dp)
            truncated = sum(gather([model.truncated], info.dp))
            if not rank0:
                continue  # generated code runs once, on rank 0
            if open_:

                def run_code(q, completion):
                    return run_program(humaneval_program(q.prompt, completion, q.reference, q.entry_point),
                                       cfg.codeTimeoutSeconds, cfg.codeMemoryMb, isolation)

                outcomes += open_outcomes(task, open_, completions, run_code)
            order = {q.id: k for k, q in enumerate(questions)}
            outcomes.sort(key=lambda o: order[o.id])
            result = task_result(task, outcomes, time.perf_counter() - start)
            if task == "humaneval":
                result["sandbox"] = isolation.describe()
            if truncated:
                result["truncatedPrompts"] = truncated
                print(f"[evaluate] {task}: {truncated} prompts were longer than the model's {max_len} "
                      "positions and lost their beginning", file=sys.stderr, flush=True)
            progress.summary(f"{task}: accuracy {result['accuracy']:.4f} on {result['samples']} questions, "
                             f"{result['questionsPerSecond']} questions/s")
            results.append(result)
        if not rank0:
            return None
        print(format_table(results), flush=True)
        target = Path(cfg.resultsPath) if cfg.resultsPath else Path(cfg.load) / "evaluation_results.json"
        summary = status_summary(results, cfg.load)
        write_json(target, {**summary, "results": results})
        print(f"[evaluate] results written to {target}", file=sys.stderr, flush=True)
        report_to_termination_message(summary)
        return results
    finally:
        if convert and info.rank == 0 and root != cfg.load:
            shutil.rmtree(root, ignore_errors=True)
        destroy_parallel()
