"""AlpacaStyleProcessRewardHandler: the text's own tokens, and the reward token of each step at its placeholder
(unshifted, -100 elsewhere), in MindSpeed's ``_packed_{input_ids,attention_mask,labels}_document`` files."""
from __future__ import annotations

import numpy as np
import pytest
from prep_support import preprocess, read_dataset, tokenizer_dir, write_jsonl  # noqa: F401

RECORDS = [{"input": "1 + 1 = 2 ки so the answer is 2 ки", "value": ["+", "+"]},
           {"input": "The fox is a dog ки so ки", "value": ["-", "+"]}]


@pytest.fixture(scope="module")
def prm_tokenizer_dir(tokenizer_dir, tmp_path_factory):
    """The shared tiny tokenizer with the placeholder added as one token, as a PRM's tokenizer has it."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.add_tokens(["ки"])
    directory = tmp_path_factory.mktemp("prm_tokenizer")
    tok.save_pretrained(directory)
    return directory


def run(tmp_path, tokenizer, records, *extra):
    prefix = tmp_path / "out" / "prm"
    rc = preprocess("--input", write_jsonl(tmp_path / "prm.jsonl", records), "--tokenizer-name-or-path", tokenizer,
                    "--output-prefix", prefix, "--handler-name", "AlpacaStyleProcessRewardHandler",
                    "--reward-tokens", "+", "-", *extra)
    return rc, str(prefix)


def test_labels_are_the_reward_tokens_at_the_placeholders(tmp_path, prm_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(prm_tokenizer_dir)
    rc, prefix = run(tmp_path, prm_tokenizer_dir, RECORDS)
    assert rc == 0
    ids = read_dataset(f"{prefix}_packed_input_ids_document")
    mask = read_dataset(f"{prefix}_packed_attention_mask_document")
    labels = read_dataset(f"{prefix}_packed_labels_document")
    assert len(ids) == len(mask) == len(labels) == 2
    assert ids[0].dtype == labels[0].dtype == np.int32
    place, plus, minus = (tok.convert_tokens_to_ids(t) for t in ("ки", "+", "-"))
    assert len({place, plus, minus}) == 3
    for record, i, m, lab in zip(RECORDS, ids, mask, labels):
        assert i.tolist() == tok(record["input"], add_special_tokens=False)["input_ids"]  # no template, no BOS
        assert m.tolist() == [1] * len(i)
        at = [p for p, t in enumerate(i.tolist()) if t == place]
        assert len(at) == 2 and at[-1] == len(i) - 1  # the text ends with its last step's placeholder
        want = [-100] * len(i)
        for p, value in zip(at, record["value"]):
            want[p] = {"+": plus, "-": minus}[value]
        assert lab.tolist() == want  # at the placeholder itself, not shifted
    # Second record by hand: its steps are "-" then "+".
    second = labels[1].tolist()
    assert [t for t in second if t != -100] == [minus, plus]


def test_a_record_whose_placeholders_and_labels_differ_is_named_by_file_and_line(tmp_path, prm_tokenizer_dir,
                                                                                  capsys):
    bad = [RECORDS[0], {"input": "one step ки two steps ки", "value": ["+"]}]
    rc, prefix = run(tmp_path, prm_tokenizer_dir, bad)
    assert rc != 0
    err = capsys.readouterr().err
    assert "prm.jsonl:2" in err and "2 placeholders" in err and "1 labels" in err
    assert not list((tmp_path / "out").glob("*.bin"))  # nothing half-written
    rc, prefix = run(tmp_path, prm_tokenizer_dir, bad, "--on-error", "skip")
    assert rc == 0 and len(read_dataset(f"{prefix}_packed_labels_document")) == 1
    rc, _ = run(tmp_path, prm_tokenizer_dir, [{"input": "a step ки", "value": ["ok"]}])
    assert rc != 0 and "not one of the rewardTokens" in capsys.readouterr().err


def test_the_placeholder_must_be_one_token(tmp_path, tokenizer_dir, capsys):
    rc, _ = run(tmp_path, tokenizer_dir, RECORDS)  # the shared tokenizer splits "ки" into bytes
    assert rc != 0 and "placeholderToken" in capsys.readouterr().err
