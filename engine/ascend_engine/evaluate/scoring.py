"""Questions -> predictions: choice questions by option likelihood (batched), open ones by greedy generation."""
from __future__ import annotations

from dataclasses import dataclass

from .answers import agieval_cloze_extract, bbh_extract, cut_at_stop, gsm8k_extract
from .questions import ChoiceQuestion, OpenQuestion, TaskDataError


@dataclass
class Outcome:
    id: str
    subject: str
    prediction: str
    gold: str
    correct: bool
    scores: list[float] | None = None  # choice tasks: each option's log-likelihood
    completion: str | None = None  # generative tasks: the generated text (cut at the stop sequences)


class Prompter:
    """Renders a question through the chat template (``empty``: unchanged), or as a user turn through the
    tokenizer's own chat template (``hf_chat_template``), and tokenizes it."""

    def __init__(self, tokenizer, template, hf_chat_template: bool = False):
        self.tokenizer, self.template, self.hf_chat_template = tokenizer, template, hf_chat_template
        self.plain = template.user == "{content}" and not template.prefix and not hf_chat_template
        if hf_chat_template and not getattr(tokenizer, "chat_template", None):
            raise TaskDataError(f"hfChatTemplate: the tokenizer {tokenizer.name_or_path} has no chat template")

    def render(self, text: str) -> str:
        if self.plain:
            return text
        if self.hf_chat_template:
            return self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                      add_generation_prompt=True)
        bos, eos = self.tokenizer.bos_token or "", self.tokenizer.eos_token or ""
        head = self.template.prefix.replace("{bos}", bos).replace("{eos}", eos)
        return head + self.template.user.replace("{bos}", bos).replace("{eos}", eos).replace("{content}", text)

    def encode_many(self, texts: list[str], rendered: bool = False) -> list[list[int]]:
        """Token ids of every text (rendered first unless they are), in one call of the tokenizer (a fast
        tokenizer encodes the batch in Rust). A chat template writes its own special tokens, so the tokenizer
        adds none (as ``apply_chat_template(tokenize=True)``)."""
        texts = texts if rendered else [self.render(t) for t in texts]
        return self.tokenizer(texts, add_special_tokens=not self.hf_chat_template)["input_ids"] if texts else []

    def encode_choices(self, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
        """(context ids, option ids) per (context, option), such that their concatenation is how the tokenizer
        reads the whole text where it splits at the boundary (lm-evaluation-harness's way), else the option on its
        own. Each distinct context is encoded once, and all texts in a few batched tokenizer calls (a question's
        context is shared by its options: one call per text was most of a 0-shot evaluation's host time)."""
        texts = [(self.render(c), o if self.plain else o.lstrip()) for c, o in pairs]
        contexts = list(dict.fromkeys(c for c, _ in texts))
        context_ids = dict(zip(contexts, self.encode_many(contexts, rendered=True)))
        wholes = self.encode_many([c + o for c, o in texts], rendered=True)
        ctxs = [context_ids[c] for c, _ in texts]
        split = [whole[: len(ctx)] == ctx and len(whole) > len(ctx) for ctx, whole in zip(ctxs, wholes)]
        alone = iter(self.tokenizer([o for (_, o), ok in zip(texts, split) if not ok], add_special_tokens=False)
                     ["input_ids"] if not all(split) else [])
        return [(ctx, whole[len(ctx):] if ok else next(alone)) for ctx, whole, ok in zip(ctxs, wholes, split)]


def _batches(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i: i + size]


def by_length(items: list, length) -> list:
    """``items`` longest first, so that a batch holds rows of similar length (little padding to compute) and a
    batch too large for memory shows in the first one."""
    return sorted(items, key=length, reverse=True)


def shared_prefix(sequences: list[list[int]], cap: int) -> list[int]:
    """The longest token prefix all ``sequences`` start with, at most ``cap`` tokens."""
    first = sequences[0]
    n = min(cap, *map(len, sequences))
    for seq in sequences[1:]:
        n = next((j for j in range(n) if seq[j] != first[j]), n)
    return first[:n]


def score_choices(model, prompter: Prompter, questions: list[ChoiceQuestion], batch_size: int,
                  progress) -> list[tuple[int, list[float]]]:
    """(predicted option, option log-likelihoods) per question. Questions whose options are distinct single
    tokens take one row (the next-token distribution after the context); others one row per option.

    Where the model can reuse a prefix's keys and values (``model.shares_prefixes``), each subject's questions
    are scored together after the tokens their contexts all start with (the task's instruction and few-shot
    examples): that prefix is encoded once per subject and each row computes only its own tail."""
    flat = iter(prompter.encode_choices([(q.context, o) for q in questions for o in q.options]))
    encoded = [[next(flat) for _ in q.options] for q in questions]
    single = [len({tuple(c) for _, c in enc}) == len(enc) and all(len(c) == 1 for _, c in enc) for enc in encoded]
    scores: list[list[float] | None] = [None] * len(questions)
    groups: dict[str, list[int]] = {}
    for i, q in enumerate(questions):
        groups.setdefault(q.subject if model.shares_prefixes else "", []).append(i)
    for members in groups.values():
        contexts = [ctx for i in members for ctx, _ in encoded[i]]
        prefix = shared_prefix(contexts, min(map(len, contexts)) - 1) if model.shares_prefixes else []
        p = len(prefix)
        one_row = by_length([i for i in members if single[i]], lambda i: len(encoded[i][0][0]))
        for chunk in _batches(one_row, batch_size):
            got = model.next_token_logprobs([encoded[i][0][0][p:] for i in chunk],
                                            [[c[0] for _, c in encoded[i]] for i in chunk], prefix)
            for i, values in zip(chunk, got):
                scores[i] = values
            progress.update(len(chunk))
        rows = by_length([(i, k) for i in members if not single[i] for k in range(len(encoded[i]))],
                          lambda row: len(encoded[row[0]][row[1]][0]) + len(encoded[row[0]][row[1]][1]))
        left = {i: len(encoded[i]) for i in members if not single[i]}
        for chunk in _batches(rows, batch_size):
            seqs = [(encoded[i][k][0] + encoded[i][k][1])[p:] for i, k in chunk]
            got = model.continuation_logprobs(seqs, [len(encoded[i][k][0]) - p for i, k in chunk], prefix)
            for (i, k), value in zip(chunk, got):
                if scores[i] is None:
                    scores[i] = [0.0] * len(encoded[i])
                scores[i][k] = value
                left[i] -= 1
                if not left[i]:
                    progress.update(1)
    return [(max(range(len(s)), key=s.__getitem__), s) for s in scores]


def choice_outcomes(questions: list[ChoiceQuestion], scored) -> list[Outcome]:
    return [Outcome(q.id, q.subject, q.options[p].strip(), q.options[q.gold].strip(), p == q.gold, scores)
            for q, (p, scores) in zip(questions, scored)]


def generate_answers(model, prompter: Prompter, questions: list[OpenQuestion], max_new: int, batch_size: int,
                     progress) -> list[str]:
    """Greedy completions, ``batch_size`` rows decoding at once, longest prompts first; a row stops once its text
    holds one of its question's stop sequences, and the next question takes its place in the batch. Cut at the
    stop sequences and returned in the questions' order."""
    tok = prompter.tokenizer
    prompts = prompter.encode_many([q.prompt for q in questions])
    order = by_length(list(range(len(questions))), lambda i: len(prompts[i]))

    def finished(row, new):
        return any(s in tok.decode(new) for s in questions[order[row]].stop)

    out: list[str] = [""] * len(questions)
    news = model.generate([prompts[i] for i in order], max_new, tok.eos_token_id, finished, batch_size=batch_size,
                          done=lambda _row: progress.update(1))
    for i, new in zip(order, news):
        out[i] = cut_at_stop(tok.decode(new, skip_special_tokens=True), questions[i].stop)
    return out


def open_outcomes(task: str, questions: list[OpenQuestion], completions: list[str], run_code) -> list[Outcome]:
    """Each task's own check: GSM8K's number, BBH's exact target, AGIEval's cloze answer, HumanEval's tests in
    the sandbox."""
    outcomes = []
    for q, text in zip(questions, completions):
        if task == "gsm8k":
            got = gsm8k_extract(text) or ""
            outcomes.append(Outcome(q.id, q.subject, got, q.reference, got == q.reference, completion=text))
        elif task == "bbh":
            got = bbh_extract(text)
            outcomes.append(Outcome(q.id, q.subject, got, q.reference, got == q.reference.strip(), completion=text))
        elif task == "agieval":
            got = agieval_cloze_extract(text)
            outcomes.append(Outcome(q.id, q.subject, got, q.reference, got == q.reference, completion=text))
        else:
            result = run_code(q, text)
            outcomes.append(Outcome(q.id, q.subject, result.reason, "passed", result.passed, completion=text))
    return outcomes
