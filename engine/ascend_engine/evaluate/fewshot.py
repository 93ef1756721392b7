"""MindSpeed-LLM's few-shot template files: each subject's examples written out once, put before its questions.

MindSpeed-LLM ships one JSON object per task under ``tasks/evaluation/eval_impl/fewshot_template/``
(``mmlu_5shot_template.json``, ``ceval_5shot_template.json``, ``cmmlu_5shot_template.json``, ``AGI_fewshot.json``,
``bbh_template.json``, ``gsm8k_3shot_template.json``): subject -> the examples text (AGIEval: [examples, question
cue, answer cue]; GSM8K: one entry, ``few_shot``). A question's prompt is that text and the question joined by
the task's own instruction format, as MindSpeed-LLM's evaluators join them (``PROMPTS``).
"""
from __future__ import annotations

import json
from pathlib import Path

from .questions import TaskDataError

# task -> how MindSpeed-LLM's evaluator joins the subject's examples and a question
PROMPTS = {
    "mmlu": "{examples}\n\n{question}\nAnswer:",
    "cmmlu": "{examples}\n\n{question}\n答案： ",
    "ceval": "{examples}\n\n问：{question}\n答：",
    "bbh": "{examples}Q: {question}\nA:",
    "gsm8k": "{examples}\n\n{question}",
    "agieval": "{examples}   {question}\n{question_cue}\n{options}\n{answer_cue}",
}


class FewShotTemplate:
    """One template file: ``prompt(subject, **parts)`` is a question's whole prompt."""

    def __init__(self, task: str, path: str):
        if task not in PROMPTS:
            raise TaskDataError(f"{path}: few-shot template files exist for {', '.join(PROMPTS)}, not {task}")
        try:
            entries = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise TaskDataError(f"{path}: not a few-shot template (a JSON object subject -> examples): {e}") from None
        shape = list if task == "agieval" else str
        if not isinstance(entries, dict) or not all(isinstance(v, shape) for v in entries.values()):
            raise TaskDataError(f"{path}: a {task} few-shot template maps each subject to "
                                + ("[examples, question cue, answer cue]" if task == "agieval" else "its examples text"))
        if task == "agieval" and not all(len(v) == 3 and all(isinstance(x, str) for x in v) for v in entries.values()):
            raise TaskDataError(f"{path}: an AGIEval template maps each subject to [examples, question cue, answer cue]")
        self.task, self.path, self.entries = task, path, entries

    def prompt(self, subject: str, **parts: str) -> str:
        key = "few_shot" if self.task == "gsm8k" else subject
        if key not in self.entries:
            raise TaskDataError(f"{self.path}: no few-shot examples for subject {key!r} (it has "
                                f"{', '.join(sorted(self.entries)[:8])}{', ...' if len(self.entries) > 8 else ''})")
        entry = self.entries[key]
        if self.task == "agieval":
            examples, question_cue, answer_cue = entry
            return PROMPTS["agieval"].format(examples=examples, question_cue=question_cue, answer_cue=answer_cue,
                                             **parts)
        return PROMPTS[self.task].format(examples=entry, **parts)
