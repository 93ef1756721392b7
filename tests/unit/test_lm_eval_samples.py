"""Our lm-eval samples files hold each document as lm-eval's own `--log_samples` writes it (issue 52): the record
is held to what lm-eval's EvaluationTracker.save_results_samples writes for the same sample, byte for byte."""
from __future__ import annotations

import copy
import json

from lm_eval.loggers.evaluation_tracker import EvaluationTracker
from lm_eval.utils import handle_non_serializable

from ascend_engine.evaluate.harness import logged_sample


def _samples():
    loglikelihood = {"doc_id": 0, "doc": {"question": "2+2?", "choices": ["3", "4"], "answer": 1}, "target": 1,
                     "arguments": [("Q: 2+2?\nA:", " 3"), ("Q: 2+2?\nA:", " 4")],
                     "resps": [[(-3.25, False)], [(-0.5, True)]], "filtered_resps": [(-3.25, False), (-0.5, True)],
                     "filter": "none", "metrics": ["acc"], "doc_hash": "a", "prompt_hash": "b", "target_hash": "c",
                     "acc": 1.0}
    generation = {"doc_id": 3, "doc": {"q": "x"}, "target": "72", "filter": "strict-match", "metrics": ["exact_match"],
                  "arguments": [("Question: ...\nAnswer:", {"until": ["Question:"], "do_sample": False})],
                  "resps": [["The answer is 72."]], "filtered_resps": ["72"], "doc_hash": "d", "prompt_hash": "e",
                  "target_hash": "f", "exact_match": 1.0}
    rolling = {"doc_id": 1, "doc": {"page": "text"}, "target": "", "filter": "none", "metrics": ["word_perplexity"],
               "arguments": [("text",)], "resps": [[-12.5]], "filtered_resps": [-12.5], "doc_hash": "g",
               "prompt_hash": "h", "target_hash": "i", "word_perplexity": (-12.5, 1)}
    return [loglikelihood, generation, rolling]


def test_records_are_lm_evals_own(tmp_path):
    tracker = EvaluationTracker(output_path=str(tmp_path / "lm_eval.json"))
    tracker.date_id = "now"
    tracker.save_results_samples("task", copy.deepcopy(_samples()))
    theirs = (tmp_path / "samples_task_now.jsonl").read_text().splitlines()
    ours = [json.dumps(logged_sample(s), default=handle_non_serializable, ensure_ascii=False) for s in _samples()]
    assert ours == theirs
    first = json.loads(ours[0])
    assert first["arguments"] == {"gen_args_0": {"arg_0": "Q: 2+2?\nA:", "arg_1": " 3"},
                                  "gen_args_1": {"arg_0": "Q: 2+2?\nA:", "arg_1": " 4"}}
    assert first["filtered_resps"] == [["-3.25", "False"], ["-0.5", "True"]] and first["target"] == "1"
