"""Task readers: each benchmark's published file layout -> questions with its usual prompt format.

Choice tasks follow the prompts MindSpeed-LLM / lm-evaluation-harness use ("...\\nAnswer:" followed by the option
letter); few-shot examples come from the task's dev (MMLU, CEval, CMMLU), train (GSM8K) or head of file (BBH), or from
a MindSpeed-LLM few-shot template file (``fewshot.FewShotTemplate``), which also fixes the prompt's format.
"""
from __future__ import annotations

import json
from pathlib import Path

from .fewshot import FewShotTemplate
from .files import column, data_files, read_csv, read_jsonl
from .questions import ChoiceQuestion, OpenQuestion, TaskDataError

LETTERS = "ABCDEFGHIJ"


# ---------------------------------------------------------------- MMLU, CEval, CMMLU: a csv per subject

_LETTER_TASKS = {
    # task: (file suffix of the evaluated split, dev split folder, dev file suffix, header, intro, answer cue)
    "mmlu": ("_test.csv", "dev", "_dev.csv", False,
             "The following are multiple choice questions (with answers) about {subject}.\n\n", "Answer:"),
    "ceval": ("_val.csv", "dev", "_dev.csv", True, "以下是中国关于{subject}考试的单项选择题，请选出其中的正确答案。\n\n", "答案："),
    "cmmlu": (".csv", "dev", ".csv", True, "以下是关于{subject}的单项选择题，请直接给出正确答案的选项。\n\n", "答案："),
}


def _letter_rows(task: str, path: Path) -> list[tuple[int, str, list[str], int]]:
    """(line, question, options, gold index) from one subject file."""
    header = _LETTER_TASKS[task][3]
    names, rows = read_csv(path, header)
    if header:
        cols = [column(path, names, c) for c in ("question", "a", "b", "c", "d", "answer")]
    else:
        cols = list(range(6))
    out = []
    for line, row in rows:
        answer = row[cols[5]].strip().upper()
        if answer not in LETTERS[:4] or not answer:
            raise TaskDataError(f"{path}:{line}: answer {row[cols[5]]!r} is not one of A, B, C, D")
        out.append((line, row[cols[0]], [row[c] for c in cols[1:5]], LETTERS.index(answer)))
    return out


def _format_letter(question: str, options: list[str], cue: str) -> str:
    lines = [question.strip()] + [f"{LETTERS[i]}. {o}" for i, o in enumerate(options)]
    return "\n".join(lines) + f"\n{cue}"


def letter_task(task: str, path: Path, shot: int, template: FewShotTemplate | None = None) -> list[ChoiceQuestion]:
    suffix, dev_folder, dev_suffix, _, intro, cue = _LETTER_TASKS[task]
    sep = " " if task == "mmlu" else ""
    questions = []
    for file in data_files(path, suffix):
        subject = file.name[: -len(suffix)]
        if template is not None:
            for line, q, opts, gold in _letter_rows(task, file):
                block = q + "".join(f"\n{LETTERS[i]}. {o}" for i, o in enumerate(opts))
                questions.append(ChoiceQuestion(
                    id=f"{file.name}:{line}", subject=subject, context=template.prompt(subject, question=block),
                    options=[f"{sep}{LETTERS[i]}" for i in range(len(opts))], gold=gold))
            continue
        examples = ""
        if shot:
            dev = (file.parent.parent / dev_folder / f"{subject}{dev_suffix}")
            if not dev.is_file():
                raise TaskDataError(f"{dev}: missing subject file (the {shot}-shot examples for {file})")
            for _, q, opts, gold in _letter_rows(task, dev)[:shot]:
                examples += _format_letter(q, opts, cue) + f"{sep}{LETTERS[gold]}\n\n"
        head = intro.format(subject=subject.replace("_", " "))
        for line, q, opts, gold in _letter_rows(task, file):
            questions.append(ChoiceQuestion(
                id=f"{file.name}:{line}", subject=subject, context=head + examples + _format_letter(q, opts, cue),
                options=[f"{sep}{LETTERS[i]}" for i in range(len(opts))], gold=gold))
    return questions


# ---------------------------------------------------------------- jsonl choice tasks

def boolq(path: Path) -> list[ChoiceQuestion]:
    """SuperGLUE/Google BoolQ jsonl: question, passage, answer (bool) or label (0/1)."""
    questions = []
    for file in data_files(path, ".jsonl"):
        for line, r in read_jsonl(file, ("question", "passage")):
            value = r.get("answer", r.get("label"))
            if not isinstance(value, (bool, int)):
                raise TaskDataError(f"{file}:{line}: needs 'answer' (true/false) or 'label' (0/1)")
            question = r["question"].strip().rstrip("?")
            questions.append(ChoiceQuestion(
                id=f"{file.name}:{line}", subject="boolq",
                context=f"{r['passage']}\nQuestion: {question}?\nAnswer:", options=[" no", " yes"],
                gold=int(bool(value))))
    return questions


def hellaswag(path: Path) -> list[ChoiceQuestion]:
    """HellaSwag jsonl: ctx, endings (4), label, activity_label (the category)."""
    questions = []
    for file in data_files(path, ".jsonl"):
        for line, r in read_jsonl(file, ("ctx", "endings", "label")):
            endings = r["endings"]
            if not isinstance(endings, list) or not endings or not str(r["label"]).isdigit() \
                    or int(r["label"]) >= len(endings):
                raise TaskDataError(f"{file}:{line}: needs a list of endings and a label indexing it")
            category = str(r.get("activity_label", "hellaswag"))
            questions.append(ChoiceQuestion(
                id=f"{file.name}:{line}", subject=category, context=f"{category}: {r['ctx']}",
                options=[" " + str(e).strip() for e in endings], gold=int(r["label"])))
    return questions


def agieval(path: Path, template: FewShotTemplate | None = None) -> list[ChoiceQuestion | OpenQuestion]:
    """AGIEval jsonl (one file per exam): passage, question, options ["(A)...", ...], label "A" (choice
    questions, scored by option likelihood), or no options and an ``answer`` (cloze questions, such as
    gaokao-mathcloze and math: answered by greedy generation, the first line compared with the answer, ``$``
    signs dropped, as MindSpeed-LLM does). Records with several correct letters are left out."""
    questions: list[ChoiceQuestion | OpenQuestion] = []
    for file in data_files(path, ".jsonl"):
        for line, r in read_jsonl(file, ("question",)):
            options, label = r.get("options") or [], r.get("label")
            if not isinstance(options, list):
                raise TaskDataError(f"{file}:{line}: 'options' must be a list")
            passage = r.get("passage") or ""
            question = f"{passage}\n{r['question']}" if passage else r["question"]
            if not options:
                if not isinstance(r.get("answer"), str) or not r["answer"].strip():
                    raise TaskDataError(f"{file}:{line}: a cloze record (no options) needs an 'answer'")
                prompt = template.prompt(file.stem, question=question, options="") if template is not None \
                    else f"{question}\nAnswer:"
                questions.append(OpenQuestion(id=f"{file.name}:{line}", subject=file.stem, prompt=prompt,
                                              reference=r["answer"].replace("$", "").strip(), stop=["\n\n"]))
                continue
            if not (isinstance(label, str) and len(label) == 1 and label in LETTERS[: len(options)]):
                continue
            listed = "\n".join(str(o) for o in options)
            if template is not None:
                context, sep = template.prompt(file.stem, question=question, options=listed), ""
            else:
                context, sep = f"{question}\n{listed}\nAnswer:", " "
            questions.append(ChoiceQuestion(
                id=f"{file.name}:{line}", subject=file.stem, context=context,
                options=[f"{sep}{LETTERS[i]}" for i in range(len(options))], gold=LETTERS.index(label)))
    if not questions:
        raise TaskDataError(f"{path}: no AGIEval records (single-letter label, or cloze with an answer)")
    return questions


# ---------------------------------------------------------------- generative tasks

def gsm8k(path: Path, shot: int, template: FewShotTemplate | None = None) -> list[OpenQuestion]:
    """GSM8K jsonl: question, answer ending in '#### <number>'; shots from train.jsonl beside the file."""
    from .answers import gsm8k_reference

    files = data_files(path, ".jsonl")
    examples = ""
    if shot and template is None:
        train = files[0].parent / "train.jsonl"
        if not train.is_file():
            raise TaskDataError(f"{train}: missing file (the {shot}-shot examples for GSM8K)")
        for line, r in read_jsonl(train, ("question", "answer"))[:shot]:
            worked = r["answer"].split("####")[0].strip()
            examples += f"Question: {r['question']}\nAnswer: {worked} The answer is {gsm8k_reference(r['answer'], f'{train}:{line}')}.\n\n"
    questions = []
    for file in files:
        if shot and file.name == "train.jsonl" and len(files) > 1:
            continue
        for line, r in read_jsonl(file, ("question", "answer")):
            prompt = template.prompt("gsm8k", question=r["question"]) if template is not None else \
                f"{examples}Question: {r['question']}\nAnswer:"
            questions.append(OpenQuestion(
                id=f"{file.name}:{line}", subject="gsm8k", prompt=prompt,
                reference=gsm8k_reference(r["answer"], f"{file}:{line}"), stop=["\n\n", "Question:"]))
    return questions


def bbh(path: Path, shot: int, template: FewShotTemplate | None = None) -> list[OpenQuestion]:
    """BIG-Bench Hard: one ``<task>.json`` per task, {"examples": [{"input", "target"}]}; the first ``shot``
    examples of each file are its few-shot prompt and are not scored (with a template: every example is scored
    after the template's examples for the file's task)."""
    questions = []
    for file in data_files(path, ".json"):
        try:
            examples = json.loads(file.read_text(encoding="utf-8"))["examples"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise TaskDataError(f"{file}: not a BBH task file ({{\"examples\": [...]}}): {e}") from None
        for i, ex in enumerate(examples):
            if not isinstance(ex, dict) or "input" not in ex or "target" not in ex:
                raise TaskDataError(f"{file}: examples[{i}] needs 'input' and 'target'")
        if template is not None:
            shot = 0
        head = "".join(f"Q: {ex['input']}\nA: {ex['target']}\n\n" for ex in examples[:shot])
        for i, ex in enumerate(examples[shot:], shot):
            prompt = template.prompt(file.stem, question=ex["input"]) if template is not None else \
                f"{head}Q: {ex['input']}\nA:"
            questions.append(OpenQuestion(
                id=f"{file.name}:examples[{i}]", subject=file.stem, prompt=prompt,
                reference=str(ex["target"]), stop=["\n\n", "\nQ:"]))
    return questions


def humaneval(path: Path) -> list[OpenQuestion]:
    """HumanEval jsonl: task_id, prompt, test, entry_point; the completion continues the prompt's function."""
    questions = []
    for file in data_files(path, ".jsonl"):
        for line, r in read_jsonl(file, ("task_id", "prompt", "test", "entry_point")):
            questions.append(OpenQuestion(
                id=str(r["task_id"]), subject="humaneval", prompt=r["prompt"], reference=r["test"],
                stop=["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#"], entry_point=r["entry_point"]))
    return questions


def load_task(task: str, path: str, shot: int, template_path: str | None = None) -> list[ChoiceQuestion | OpenQuestion]:
    """The questions of ``task`` read from ``path``, with the examples of a MindSpeed-LLM few-shot template file
    if ``template_path`` is given (AGIEval: choice and cloze questions in one list)."""
    root = Path(path)
    template = FewShotTemplate(task, template_path) if template_path else None
    if task in _LETTER_TASKS:
        return letter_task(task, root, shot, template)
    readers = {"boolq": lambda: boolq(root), "hellaswag": lambda: hellaswag(root),
               "agieval": lambda: agieval(root, template),
               "gsm8k": lambda: gsm8k(root, shot, template), "bbh": lambda: bbh(root, shot, template),
               "humaneval": lambda: humaneval(root)}
    if task not in readers:
        raise TaskDataError(f"unknown task {task!r}")
    return readers[task]()
