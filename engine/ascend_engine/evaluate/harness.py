"""lm-evaluation-harness on our engine: ``AscendLM`` answers lm-eval's three request kinds with the Megatron model
at any TP/PP/DP layout, through the same batched scoring and generation as our own tasks (ragged right-padded
batches, a shared prefix's keys and values computed once, KV-cached greedy generation), and ``run`` evaluates
lm-eval's own task definitions with it (``ascend-engine evaluate --backend lm-eval --task <task or group>``).

Every rank runs lm-eval the same way (it sees one process: rank 0 of 1), so every rank builds the same requests in
the same order; inside each request kind, each data-parallel replica computes its contiguous share and the
answers are gathered on every rank, so every rank's lm-eval computes the same metrics, and global rank 0 writes
them. Tokenization, truncation, rolling windows and stop sequences follow lm-eval's HF backend (``--model hf``)
so that the same checkpoint gives the same numbers.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from lm_eval import utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, has_bos_prefix, normalize_gen_kwargs, \
    postprocess_generated_text

from .questions import TaskDataError
from .scoring import shared_prefix
from .sharding import gather, share


@register_model("ascend")
class AscendLM(TemplateLM):
    """lm-eval's ``LM`` over an ``InferenceModel`` (evaluate/model.py) and its HF tokenizer. Built in-process by
    ``ascend-engine evaluate`` after the model is loaded (``--model ascend`` on lm-eval's own command line has
    no process group to load into)."""

    def __init__(self, model=None, tokenizer=None, info=None, batch_size: int = 8, max_gen_toks: int = 256,
                 max_length: int | None = None, add_bos_token: bool | None = None,
                 prefix_token_id: int | None = None, log=None):
        if model is None:
            raise ValueError("the ascend model is built by `ascend-engine evaluate --backend lm-eval` (it loads the "
                             "Megatron checkpoint into its TP/PP/DP process group), not from lm-eval's --model_args")
        super().__init__()
        self.model, self.tokenizer, self.info = model, tokenizer, info
        self.batch_size, self._max_gen_toks = int(batch_size), int(max_gen_toks)
        self._max_length, self.add_bos_token, self.custom_prefix_token_id = max_length, add_bos_token, prefix_token_id
        self.log = log or (lambda message: None)

    # ------------------------------------------------------------------ what lm-eval asks of a model
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        if self.custom_prefix_token_id is not None:
            return self.custom_prefix_token_id
        if self.tokenizer.bos_token_id is not None:
            return self.tokenizer.bos_token_id
        return self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        return self._max_length or self.model.max_len

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name_or_path.replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return getattr(self.tokenizer, "chat_template", None) if chat_template else None

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt,
                                                  continue_final_message=not add_generation_prompt)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, left_truncate_len: int | None = None,
                   **kwargs) -> list[int]:
        """As lm-eval's HF backend: the tokenizer's own special tokens unless told, none where the text already
        starts with the prefix token."""
        if add_special_tokens is None:
            add_special_tokens = self.add_bos_token
            if has_bos_prefix(string, self.tokenizer.decode(self.prefix_token_id)):
                add_special_tokens = False
        special = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        ids = self.tokenizer.encode(string, **special)
        return ids[-left_truncate_len:] if left_truncate_len else ids

    def tok_decode(self, tokens, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)

    # ------------------------------------------------------------------ the three request kinds
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """(log-likelihood, is_greedy) of each (context ids, continuation ids). A row too long for the model
        keeps its last ``max_length + 1`` tokens (as the HF backend's input window: the last token is only a
        target). Rows are ordered by their tokens, so a question's options (and
        a task's shared few-shot text) are neighbours; a batch's common prefix is encoded once."""
        cap = min(self.max_length, self.model.max_len) + 1
        rows, starts = [], []
        for _, context, continuation in requests:
            row = (list(context) + list(continuation))[-cap:]
            rows.append(row)
            starts.append(max(1, len(row) - len(continuation)))
        order = sorted(range(len(rows)), key=lambda i: (rows[i], i))
        mine = share(order, self.info.dp_rank, self.info.dp)
        scored: list[tuple[float, bool]] = []
        for b in range(0, len(mine), self.batch_size):
            chunk = mine[b: b + self.batch_size]
            prefix = shared_prefix([rows[i] for i in chunk], min(starts[i] for i in chunk) - 1) \
                if self.model.shares_prefixes else []
            p = len(prefix)
            scored += self.model.continuation_scores([rows[i][p:] for i in chunk], [starts[i] - p for i in chunk],
                                                     prefix)
        result: list = [None] * len(rows)
        for i, value in zip(order, gather(scored, self.info.dp)):
            result[i] = value
        for (key, _, _), value in zip(requests, result):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, value)
        return result

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each text's whole log-likelihood in lm-eval's disjoint rolling windows of ``max_length`` tokens
        (the first one after the prefix token), all windows of all texts batched together."""
        windows, owners = [], []
        for k, (string,) in enumerate(req.args for req in requests):
            for context, continuation in map(utils.make_disjoint_window, utils.get_rolling_token_windows(
                    token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append((None, context, continuation))
                owners.append(k)
        self.log(f"loglikelihood_rolling: {len(requests)} texts in {len(windows)} windows")
        totals = [0.0] * len(requests)
        for k, (value, _) in zip(owners, self._loglikelihood_tokens(windows)):
            totals[k] += value
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        self.log(f"loglikelihood: {len(requests)} requests")
        return super().loglikelihood(requests, disable_tqdm=True)

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations, cut at the request's ``until`` strings and the end-of-text token's text, at most
        ``max_gen_toks`` new tokens (the task's, else ``maxNewTokens``); the context keeps its last
        ``max_length - max_gen_toks`` tokens. Requests with the same generation settings go in batches of prompts
        of similar length."""
        self.log(f"generate_until: {len(requests)} requests")
        eos = self.tok_decode(self.eot_token_id, skip_special_tokens=False)
        groups: dict[str, list[int]] = {}
        for k, req in enumerate(requests):
            groups.setdefault(json.dumps(req.args[1], sort_keys=True, default=str), []).append(k)
        out: list[str] = [""] * len(requests)
        for members in groups.values():
            kwargs = normalize_gen_kwargs(requests[members[0]].args[1], self.max_gen_toks)
            if kwargs.get("do_sample") or float(kwargs.get("temperature") or 0.0) > 0.0:
                raise TaskDataError(f"{requests[members[0]].task_name}: its generation_kwargs ask for sampling "
                                    f"({kwargs}); this backend decodes greedily (set do_sample: false)")
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            room = kwargs.pop("max_gen_toks")
            if room >= self.max_length:
                raise TaskDataError(f"max_gen_toks {room} leaves no room for a prompt in {self.max_length} tokens")
            prompts = {}
            for k in members:
                context = requests[k].args[0]
                special = False if has_bos_prefix(context, self.tokenizer.bos_token) else self.add_bos_token
                prompts[k] = self.tok_encode(context, add_special_tokens=special,
                                             left_truncate_len=self.max_length - room)
            order = sorted(members, key=lambda k: (-len(prompts[k]), requests[k].args[0]))
            mine = share(order, self.info.dp_rank, self.info.dp)
            texts = []
            for b in range(0, len(mine), self.batch_size):
                chunk = mine[b: b + self.batch_size]

                def finished(row, new, chunk=chunk):
                    text = self.tokenizer.decode(new)
                    return any(s and s in text for s in until)

                for new in self.model.generate([prompts[k] for k in chunk], room, self.eot_token_id, finished):
                    texts.append(postprocess_generated_text(self.tok_decode(new), until, None))
            for k, text in zip(order, gather(texts, self.info.dp)):
                out[k] = text
                self.cache_hook.add_partial("generate_until", requests[k].args, text)
        return out

    def get_model_info(self) -> dict:
        return {"model_backend": "ascend-engine", "tensor_parallel": self.info.tp, "pipeline_parallel": self.info.pp,
                "data_parallel": self.info.dp, "max_length": self.max_length}


# ---------------------------------------------------------------------- a run of lm-eval tasks

def offline() -> None:
    """No hub at run time: datasets and models come from local files and caches (set before ``datasets`` is
    imported; an explicit setting in the environment wins)."""
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        os.environ.setdefault(name, "1")


def task_manager(cfg):
    """lm-eval's task index (its own tasks plus ``includePath``), with every requested name known to it."""
    from lm_eval.tasks import TaskManager

    for folder in cfg.includePath or []:
        if not Path(folder).is_dir():
            raise TaskDataError(f"includePath: {folder}: no such directory")
    if cfg.includePath:  # indexing lm-eval's own thousands of tasks takes seconds: only when a name needs them
        manager = TaskManager(include_path=cfg.includePath, include_defaults=False)
        if all(t in manager.all_tasks for t in cfg.lm_eval_tasks):
            return manager
    manager = _own_folders(cfg)
    if manager is not None:
        return manager
    manager = TaskManager(include_path=cfg.includePath)
    unknown = [t for t in cfg.lm_eval_tasks if t not in manager.all_tasks]
    if unknown:
        raise TaskDataError(f"task: {', '.join(unknown)}: not an lm-eval task, group or tag (lm-eval {_version()} "
                            f"knows {len(manager.all_tasks)}; local task YAML folders go in includePath)")
    return manager


def use_local_datasets(manager, cfg):
    """With ``datasetsDir``: every task ``manager`` builds reads its hub dataset from ``<datasetsDir>/<dataset_path>``
    (lm-eval's task definitions unchanged: its task factory's config gets the local folder as ``dataset_path``),
    and every requested task's dataset is checked to be there now, before the model loads."""
    if cfg.datasetsDir is None:
        return manager
    if not Path(cfg.datasetsDir).is_dir():
        raise TaskDataError(f"datasetsDir: {cfg.datasetsDir}: no such directory")
    manager._factory = LocalDatasets(cfg.datasetsDir, meta=manager._factory._meta)
    for name in cfg.lm_eval_tasks:
        _check_datasets(manager, name, {}, set())
    return manager


def _is_hub_name(dataset_path) -> bool:
    """A hub dataset's name (``cais/mmlu``), not a packaged builder (``json``, ``parquet``) or a local folder."""
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

    return isinstance(dataset_path, str) and dataset_path not in _PACKAGED_DATASETS_MODULES \
        and not Path(dataset_path).is_absolute() and not Path(dataset_path).exists()


def local_dataset(folder: str, task, dataset_path) -> str | None:
    """The local copy of hub dataset ``dataset_path`` in ``folder`` (None where the task names no hub dataset);
    a hub dataset that is not there is an error naming the task, the dataset and the folder looked in."""
    if not _is_hub_name(dataset_path):
        return None
    local = Path(folder) / dataset_path
    if not local.is_dir():
        raise TaskDataError(f"{task}: its dataset {dataset_path} is not in datasetsDir: no folder {local} (fill it on "
                            f"a connected machine: huggingface-cli download --repo-type dataset {dataset_path} "
                            f"--local-dir {local})")
    return str(local)


try:
    from lm_eval.tasks._factory import GROUP_FIELD_NAMES, TaskFactory
except ImportError:  # an lm-eval without the task factory (before 0.4.10): datasetsDir is refused at use
    TaskFactory, GROUP_FIELD_NAMES = object, set()


class LocalDatasets(TaskFactory):
    """lm-eval's task factory, with each task config's hub ``dataset_path`` replaced by its local copy."""

    def __init__(self, folder: str, meta=None):
        if TaskFactory is object:
            raise TaskDataError(f"datasetsDir needs lm-eval 0.4.10 or later (this is {_version()})")
        super().__init__(meta=meta)
        self.folder = folder

    def _load_full_config(self, entry, overrides=None):
        cfg = super()._load_full_config(entry, overrides)
        local = local_dataset(self.folder, cfg.get("task", entry.name), cfg.get("dataset_path"))
        if local is not None:
            cfg["dataset_path"] = local
        return cfg


def _check_datasets(manager, name: str, overrides: dict, seen: set) -> None:
    """Walk a task, group or tag's members as lm-eval's factory does (without building them: no data read) and
    resolve each task's dataset, so a missing one fails before the model loads."""
    from lm_eval.tasks._index import Kind

    entry = manager._index.get(name)
    if entry is None or (name, str(overrides)) in seen:
        return
    seen.add((name, str(overrides)))
    if entry.kind == Kind.TAG:
        for member in sorted(entry.tags):
            _check_datasets(manager, member, overrides, seen)
        return
    cfg = manager._factory._load_full_config(entry, overrides if entry.kind != Kind.GROUP else None)
    if entry.kind != Kind.GROUP:
        return
    merged = {**{k: v for k, v in cfg.items() if k not in GROUP_FIELD_NAMES}, **overrides}
    for item in cfg.get("task") if isinstance(cfg.get("task"), list) else []:
        if isinstance(item, str):
            _check_datasets(manager, item, merged, seen)
        elif isinstance(item, dict) and isinstance(item.get("task") or item.get("group"), str):
            member = item.get("task") or item.get("group")
            _check_datasets(manager, member, {**merged, **{k: v for k, v in item.items() if k not in
                                                           ("task", "group")}}, seen)


def _own_folders(cfg):
    """lm-eval's task index over only the folders of its own tasks named like the requested ones
    (``lm_eval/tasks/mmlu``, ``.../hellaswag``, ``.../gsm8k``) and ``includePath``: some 15 s less than its whole
    index on two cores. Used only where it builds what the whole index would: every task, group and tag the
    requested names reach is in it, and no YAML file outside those folders defines one of those tasks or groups
    again or names one of those tags (a tag's members may live anywhere); None otherwise."""
    import re

    import lm_eval.tasks
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._index import Kind

    root = Path(lm_eval.tasks.__file__).parent
    folders = [root / name for name in dict.fromkeys(cfg.lm_eval_tasks)]
    if not all(f.is_dir() and f.parent == root for f in folders):
        return None
    manager = TaskManager(include_path=[*map(str, folders), *(cfg.includePath or [])], include_defaults=False)
    reached: dict[str, object] = {}
    pending = list(cfg.lm_eval_tasks)
    while pending:
        name = pending.pop()
        if name in reached:
            continue
        entry = manager._index.get(name)
        if entry is None:
            return None
        reached[name] = entry.kind
        if entry.kind == Kind.TAG:
            pending += entry.tags
        elif entry.kind == Kind.GROUP:
            members = manager._factory._load_full_config(entry).get("task")
            for item in members if isinstance(members, list) else [members]:
                member = item if isinstance(item, str) else (item or {}).get("task") or (item or {}).get("group")
                if not isinstance(member, str):
                    return None
                pending.append(member)
    defined = [n for n, kind in reached.items() if kind != Kind.TAG]
    tags = [n for n, kind in reached.items() if kind == Kind.TAG]
    word = r"(?<![\w./-])(?:{})(?![\w./-])"
    definition = re.compile(r"^\s*[\"']?(?:task|group)[\"']?\s*:\s*[\"']?" + word.format(
        "|".join(map(re.escape, defined))) + r"[\"']?\s*$", re.M) if defined else None
    mention = re.compile(word.format("|".join(map(re.escape, tags)))) if tags else None
    for path in root.rglob("*.yaml"):
        if any(f in path.parents for f in folders):
            continue
        text = path.read_text(encoding="utf-8", errors="ignore")
        if (definition and definition.search(text)) or (mention and mention.search(text)):
            return None
    return manager


def _version() -> str:
    from importlib.metadata import version

    return version("lm_eval")


def run(cfg, manager, model, tokenizer, info) -> dict | None:
    """lm-eval's ``simple_evaluate`` of ``cfg``'s tasks with ``AscendLM``; on global rank 0 the results are
    written in lm-eval's format (``resultsPath``; each task's samples beside it as
    ``<stem>_samples_<task>.jsonl``), printed as lm-eval's table and summarised for ``status.evaluation``."""
    from lm_eval import simple_evaluate
    from lm_eval.utils import handle_non_serializable, make_table

    from .report import lm_eval_summary, report_to_termination_message, write_json

    lm = AscendLM(model, tokenizer, info, batch_size=cfg.evaluationBatchSize, max_gen_toks=cfg.maxNewTokens,
                  log=lambda message: print(f"[evaluate] {message}", file=sys.stderr, flush=True)
                  if info.rank == 0 else None)
    start = time.perf_counter()
    try:  # lm-eval's refusals and a dataset that is not in the local files or cache: bad task data
        results = simple_evaluate(
            model=lm, tasks=cfg.lm_eval_tasks, task_manager=manager, limit=cfg.maxEvalSamples,
            num_fewshot=cfg.shot if "shot" in cfg.model_fields_set else None, batch_size=cfg.evaluationBatchSize,
            apply_chat_template=cfg.hfChatTemplate, bootstrap_iters=cfg.bootstrapIters, log_samples=True)
    except (ValueError, OSError) as e:
        raise TaskDataError(f"lm-eval: {type(e).__name__}: {e}") from e
    seconds = time.perf_counter() - start
    if info.rank != 0 or results is None:
        return None
    samples = results.pop("samples", {})
    results["config"]["model"] = f"ascend-engine:{cfg.load}"
    print(make_table(results), flush=True)
    if results.get("groups"):
        print(make_table(results, "groups"), flush=True)
    target = Path(cfg.resultsPath) if cfg.resultsPath else Path(cfg.load) / "evaluation_results.json"
    write_json(target, json.loads(json.dumps(results, default=handle_non_serializable)))
    for task, docs in samples.items():
        with open(target.with_name(f"{target.stem}_samples_{task}.jsonl"), "w", encoding="utf-8") as f:
            for doc in docs:
                f.write(json.dumps(doc, default=handle_non_serializable, ensure_ascii=False) + "\n")
    print(f"[evaluate] lm-eval results written to {target}", file=sys.stderr, flush=True)
    summary = lm_eval_summary(results, cfg.lm_eval_tasks, cfg.load, seconds)
    report_to_termination_message(summary)
    return results
