"""lm-evaluation-harness on our engine: ``AscendLM`` answers lm-eval's three request kinds with the Megatron model
at any TP/PP/DP layout, through the same batched scoring and generation as our own tasks (ragged right-padded
batches, a shared prefix's keys and values computed once, KV-cached greedy generation), and ``run`` evaluates
lm-eval's own task definitions with it (``ascend-engine evaluate --backend lm-eval --task <task or group>``; which
definitions and datasets: evaluate/harness_tasks.py).

Every rank runs lm-eval the same way (it sees one process: rank 0 of 1), so every rank builds the same requests in
the same order; inside each request kind, each data-parallel replica computes its contiguous share and the
answers are gathered on every rank, so every rank's lm-eval computes the same metrics, and global rank 0 writes
them. Tokenization, truncation, rolling windows and stop sequences follow lm-eval's HF backend (``--model hf``)
so that the same checkpoint gives the same numbers.
"""
from __future__ import annotations

import json
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

            def finished(row, new, until=until):
                text = self.tokenizer.decode(new)
                return any(s and s in text for s in until)

            news = self.model.generate([prompts[k] for k in mine], room, self.eot_token_id, finished,
                                       batch_size=self.batch_size)
            texts = [postprocess_generated_text(self.tok_decode(new), until, None) for new in news]
            for k, text in zip(order, gather(texts, self.info.dp)):
                out[k] = text
                self.cache_hook.add_partial("generate_until", requests[k].args, text)
        return out

    def get_model_info(self) -> dict:
        return {"model_backend": "ascend-engine", "tensor_parallel": self.info.tp, "pipeline_parallel": self.info.pp,
                "data_parallel": self.info.dp, "max_length": self.max_length}


def logged_sample(sample: dict) -> dict:
    """One document's record as lm-eval's own ``--log_samples`` writes it (``EvaluationTracker.
    save_results_samples``), so tools that read lm-eval's samples files (``datasets.load_dataset("json", ...)``,
    lm-eval's own loaders, a comparison with an ``lm_eval --log_samples`` run) read ours: ``arguments`` as
    ``{"gen_args_<i>": {"arg_<j>": ...}}`` instead of lists of tuples, every response and filtered response as a
    string (a log-likelihood ``"-3.25"``, is_greedy ``"True"``), ``target`` as a string."""
    from lm_eval.utils import sanitize_list

    arguments = {f"gen_args_{i}": {f"arg_{j}": value for j, value in enumerate(arg)}
                 for i, arg in enumerate(sample["arguments"])}
    return {**sample, "arguments": arguments, "resps": sanitize_list(sample["resps"]),
            "filtered_resps": sanitize_list(sample["filtered_resps"]), "target": str(sample["target"])}


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
                f.write(json.dumps(logged_sample(doc), default=handle_non_serializable, ensure_ascii=False) + "\n")
    print(f"[evaluate] lm-eval results written to {target}", file=sys.stderr, flush=True)
    summary = lm_eval_summary(results, cfg.lm_eval_tasks, cfg.load, seconds)
    report_to_termination_message(summary)
    return results
