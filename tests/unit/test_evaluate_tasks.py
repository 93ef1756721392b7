"""Evaluation without a model: benchmark readers and their errors, GSM8K/BBH answer checks (the code sandbox has
test_sandbox.py)."""
from __future__ import annotations

import json

import pytest

from ascend_engine.evaluate.answers import (agieval_cloze_extract, bbh_extract, cut_at_stop, gsm8k_extract,
                                           gsm8k_reference)
from ascend_engine.evaluate.questions import TaskDataError
from ascend_engine.evaluate.tasks import load_task


def _mmlu(root, rows="q?,a,b,c,d,B\n", dev=True):
    (root / "test").mkdir(parents=True)
    (root / "test" / "astronomy_test.csv").write_text(rows)
    if dev:
        (root / "dev").mkdir()
        (root / "dev" / "astronomy_dev.csv").write_text("Which?,w,x,y,z,C\n")
    return root / "test"


def test_mmlu_prompt_with_a_few_shot_example(tmp_path):
    [q] = load_task("mmlu", str(_mmlu(tmp_path)), shot=1)
    assert q.context == ("The following are multiple choice questions (with answers) about astronomy.\n\n"
                         "Which?\nA. w\nB. x\nC. y\nD. z\nAnswer: C\n\nq?\nA. a\nB. b\nC. c\nD. d\nAnswer:")
    assert q.options == [" A", " B", " C", " D"] and q.gold == 1 and q.subject == "astronomy"


def test_missing_subject_dev_file_is_named(tmp_path):
    with pytest.raises(TaskDataError, match=r"dev/astronomy_dev.csv: missing subject file"):
        load_task("mmlu", str(_mmlu(tmp_path, dev=False)), shot=5)
    assert load_task("mmlu", str(tmp_path / "test"), shot=0)  # zero-shot needs no dev split


def test_malformed_csv_row_names_file_and_line(tmp_path):
    test = _mmlu(tmp_path, rows='q1,a,b,c,d,A\n"a question\nover two lines",a,b,c,d,B\nq3,a,b,c,A\n')
    with pytest.raises(TaskDataError, match=r"astronomy_test.csv:4: expected 6 columns, got 5"):
        load_task("mmlu", str(test), shot=0)
    (test / "astronomy_test.csv").write_text("q1,a,b,c,d,E\n")
    with pytest.raises(TaskDataError, match=r"astronomy_test.csv:1: answer 'E' is not one of A, B, C, D"):
        load_task("mmlu", str(test), shot=0)


def test_ceval_and_cmmlu_read_their_headers(tmp_path):
    (tmp_path / "val").mkdir()
    (tmp_path / "val" / "law_val.csv").write_text("id,question,A,B,C,D,answer,explanation\n0,问?,甲,乙,丙,丁,D,\n")
    [q] = load_task("ceval", str(tmp_path / "val"), shot=0)
    assert q.context.endswith("问?\nA. 甲\nB. 乙\nC. 丙\nD. 丁\n答案：") and q.gold == 3 and q.options[0] == "A"
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "art.csv").write_text(",Question,A,B,C,D,Answer\n0,问?,甲,乙,丙,丁,A\n")
    [q] = load_task("cmmlu", str(tmp_path / "test"), shot=0)
    assert q.subject == "art" and q.gold == 0


def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    path = tmp_path / "boolq.jsonl"
    path.write_text(json.dumps({"question": "is it", "passage": "p", "answer": True}) + "\n\n{not json\n")
    with pytest.raises(TaskDataError, match=r"boolq.jsonl:3: not valid JSON"):
        load_task("boolq", str(path), 0)
    path.write_text(json.dumps({"question": "is it", "answer": True}) + "\n")
    with pytest.raises(TaskDataError, match=r"boolq.jsonl:1: missing passage"):
        load_task("boolq", str(path), 0)


def test_jsonl_choice_tasks(tmp_path):
    (tmp_path / "b.jsonl").write_text(json.dumps({"question": "is water wet", "passage": "P.", "label": 1}) + "\n")
    [q] = load_task("boolq", str(tmp_path / "b.jsonl"), 0)
    assert q.context == "P.\nQuestion: is water wet?\nAnswer:" and q.options == [" no", " yes"] and q.gold == 1
    (tmp_path / "h.jsonl").write_text(json.dumps(
        {"ctx": "A man", "endings": ["runs.", "sits."], "label": "1", "activity_label": "Sports"}) + "\n")
    [q] = load_task("hellaswag", str(tmp_path / "h.jsonl"), 0)
    assert q.subject == "Sports" and q.options == [" runs.", " sits."] and q.gold == 1
    (tmp_path / "agi").mkdir()
    (tmp_path / "agi" / "lsat-ar.jsonl").write_text(
        json.dumps({"passage": None, "question": "Q", "options": ["(A)x", "(B)y"], "label": "B"}) + "\n" +
        json.dumps({"passage": None, "question": "cloze", "options": None, "label": None, "answer": "3"}) + "\n")
    q, cloze = load_task("agieval", str(tmp_path / "agi"), 0)
    assert q.subject == "lsat-ar" and q.context == "Q\n(A)x\n(B)y\nAnswer:" and q.gold == 1
    assert cloze.prompt == "cloze\nAnswer:" and cloze.reference == "3"  # cloze: answered by generation
    assert agieval_cloze_extract("\n $\\frac{1}{2}$ \nProblem 2.") == "\\frac{1}{2}"


def test_gsm8k_answer_extraction():
    assert gsm8k_reference("She pays 3*4=12.\n#### 1,200", "f:1") == "1200"
    with pytest.raises(TaskDataError, match="f:2: GSM8K answer has no"):
        gsm8k_reference("12", "f:2")
    assert gsm8k_extract("First 3 + 4 = 7. Then 7 * 2 = 14. The answer is 14.") == "14"
    assert gsm8k_extract("The answer is $1,250.00, not 3.") == "1250"
    assert gsm8k_extract("3 apples and then 5 more makes 8") == "8"
    assert gsm8k_extract("#### -4") == "-4"
    assert gsm8k_extract("0.5 of 3 is 1.5") == "1.5"
    assert gsm8k_extract("no number at all") is None
    assert cut_at_stop("The answer is 8.\n\nQuestion: next", ["\n\n", "Question:"]) == "The answer is 8."


def test_gsm8k_and_bbh_readers(tmp_path):
    rows = [{"question": f"q{i}", "answer": f"work\n#### {i}"} for i in range(3)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "test.jsonl").write_text(json.dumps(rows[2]) + "\n")
    [q] = load_task("gsm8k", str(tmp_path / "test.jsonl"), 2)
    assert q.prompt.startswith("Question: q0\nAnswer: work The answer is 0.\n\n") and q.reference == "2"
    (tmp_path / "bbh").mkdir()
    (tmp_path / "bbh" / "navigate.json").write_text(json.dumps(
        {"examples": [{"input": "go", "target": "Yes"}, {"input": "stay", "target": "No"}]}))
    [q] = load_task("bbh", str(tmp_path / "bbh"), 1)
    assert q.prompt == "Q: go\nA: Yes\n\nQ: stay\nA:" and q.reference == "No"
    assert bbh_extract(" No.\nbecause") == "No"


def test_config_needs_one_data_path_per_task():
    from pydantic import ValidationError

    from ascend_engine.config.evaluate import EvaluateConfig

    with pytest.raises(ValidationError, match="taskDataPath has 1 entries for 2 tasks"):
        EvaluateConfig(task=["mmlu", "gsm8k"], taskDataPath=["x"], load="c", tokenizerNameOrPath="t")
    with pytest.raises(ValidationError, match="fewShotTemplate has 1 entries for 2 tasks"):
        EvaluateConfig(task=["mmlu", "gsm8k"], taskDataPath=["x", "y"], fewShotTemplate=["-"], load="c",
                       tokenizerNameOrPath="t")
    with pytest.raises(ValidationError, match="hfChatTemplate: the tokenizer's chat template and promptType"):
        EvaluateConfig(task=["mmlu"], taskDataPath=["x"], hfChatTemplate=True, promptType="qwen3", load="c",
                       tokenizerNameOrPath="t")


def test_mindspeed_few_shot_template_files(tmp_path):
    """MindSpeed-LLM's fewshot_template JSON (subject -> examples; AGIEval: [examples, question cue, answer cue])
    builds each prompt as its evaluator does; a subject the file lacks is named."""
    mmlu = tmp_path / "mmlu_5shot_template.json"
    mmlu.write_text(json.dumps({"astronomy": "The following ... about  astronomy.\nWhich?\nA. w\nAnswer: C"}))
    [q] = load_task("mmlu", str(_mmlu(tmp_path / "m", dev=False)), 5, str(mmlu))
    assert q.context == ("The following ... about  astronomy.\nWhich?\nA. w\nAnswer: C\n\n"
                         "q?\nA. a\nB. b\nC. c\nD. d\nAnswer:") and q.options[1] == " B"
    mmlu.write_text(json.dumps({"anatomy": "x"}))
    with pytest.raises(TaskDataError, match="mmlu_5shot_template.json: no few-shot examples for subject 'astronomy'"):
        load_task("mmlu", str(tmp_path / "m" / "test"), 5, str(mmlu))
    agi = tmp_path / "AGI_fewshot.json"
    agi.write_text(json.dumps({"math": ["Problem 1. 1+1\nAnswer:2\n\nProblem 2.", "\nChoose:\n", "\nAnswer:"]}))
    (tmp_path / "agi").mkdir()
    (tmp_path / "agi" / "math.jsonl").write_text(json.dumps({"passage": None, "question": "2+2", "options": None,
                                                             "label": None, "answer": "$4$"}) + "\n")
    [q] = load_task("agieval", str(tmp_path / "agi"), 0, str(agi))
    assert q.prompt == "Problem 1. 1+1\nAnswer:2\n\nProblem 2.   2+2\n\nChoose:\n\n\n\nAnswer:" and q.reference == "4"
    gsm = tmp_path / "gsm8k_3shot_template.json"
    gsm.write_text(json.dumps({"few_shot": "Q: 1+1?\n\nA: 2."}))
    (tmp_path / "g.jsonl").write_text(json.dumps({"question": "2+2?", "answer": "#### 4"}) + "\n")
    [q] = load_task("gsm8k", str(tmp_path / "g.jsonl"), 0, str(gsm))
    assert q.prompt == "Q: 1+1?\n\nA: 2.\n\n2+2?"
    with pytest.raises(TaskDataError, match="few-shot template files exist for"):
        load_task("boolq", str(tmp_path / "g.jsonl"), 0, str(gsm))


def test_hf_chat_template_wraps_the_question_as_a_user_turn():
    """``--hf-chat-template``: the tokens are ``apply_chat_template`` of one user turn with the generation prompt
    (MindSpeed-LLM's way), options follow the assistant cue; a tokenizer without a chat template is refused."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from ascend_engine.evaluate.scoring import Prompter
    from ascend_engine.prep.templates import load_template

    words = "<s> <unk> <|im_start|> <|im_end|> user assistant Which ? Answer : B".split()
    model = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.Split("\n", "removed")
    model.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=model, unk_token="<unk>", bos_token="<s>",
                                        additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    tokenizer._tokenizer.post_processor = None

    with pytest.raises(TaskDataError, match="has no chat template"):
        Prompter(tokenizer, load_template("empty", None), hf_chat_template=True)
    tokenizer.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                               "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    prompter = Prompter(tokenizer, load_template("empty", None), hf_chat_template=True)
    expected = tokenizer.apply_chat_template([{"role": "user", "content": "Which? Answer:"}], tokenize=True,
                                             add_generation_prompt=True, return_dict=True)["input_ids"]
    assert prompter.encode_many(["Which? Answer:"]) == [expected]
    [(ctx, option)] = prompter.encode_choices([("Which? Answer:", " B")])
    assert ctx == expected and tokenizer.decode(option) == "B"


def test_choice_encoding_splits_at_the_boundary_or_encodes_the_option_alone():
    """Options are read as the tokenizer reads context + option where it splits at the boundary; where the two
    merge into another token, the option's own tokens follow the context (lm-evaluation-harness's rule). One
    batched call per kind of text gives each pair what a call per text gives."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from ascend_engine.evaluate.scoring import Prompter
    from ascend_engine.prep.templates import load_template

    words = "<unk> Answer : w1 w2 B C 2".split()
    model = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=model, unk_token="<unk>")
    pairs = [("Answer : w1", " B"), ("Answer : w1", "2"), ("w2 Answer :", " C"), ("Answer : w1", " C")]
    got = Prompter(tokenizer, load_template("empty", None)).encode_choices(pairs)
    ids = {w: i for i, w in enumerate(words)}
    assert got == [([1, 2, 3], [5]), ([1, 2, 3], [7]), ([4, 1, 2], [6]), ([1, 2, 3], [6])]
    assert tokenizer("Answer : w12")["input_ids"][-1] == ids["<unk>"]  # why the second pair falls back
