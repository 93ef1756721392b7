"""Batched generation with megatron-core's KV cache: the same tokens as without it, at TP1, TP2 and PP2.

Greedy tokens are held to inference's tolerance parity (docs/performance.md, Inference): equal to the reference
(uncached generation at TP1) except after a near tie, a step where the reference's top two logits differ by less
than twice float32's rounding of a logit (the rows may then part; the count is printed), and log-probabilities
equal up to there within that rounding.

The bound (tests/float_bounds.py): every path and layout computes the same float32 forward in another order
(the cache, the lean decode step's packed products, TP's split reductions), so they differ by delta =
sqrt(K = 256, the FFN width) x (2 layers + 2) x 2**-24 = 3.8e-6 of the size of what they compute: the largest
|logit| for a top-two gap (a near tie is a gap under 2 x 3.8e-6 x that, 4.5e-6 for these logits of up to 0.59; the
former threshold was a fixed 1e-3, above the smallest gap of these runs, 6.0e-4, where it would have excused a
parting that rounding cannot explain), the largest |log-probability| of the compared row for log-probabilities
(about 2e-5 for values near -5; the former allowance was 1e-5 + 1e-4 of the value, about 5e-4 there, and 1e-4 +
1e-4 across layouts).

One torchrun with two processes builds the same seeded tiny GPT at each layout in turn
(``generate_layouts_worker.py``); this file checks what it wrote.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from ascend_engine.generate.batched import strip_padding
from float_bounds import forward_atol, model_delta
from test_train_torchrun import VENV_BIN, assert_ok, free_port

WORKER = Path(__file__).with_name("generate_layouts_worker.py")
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [15], [16, 17, 18, 19]]
DELTA = model_delta({"numLayers": 2, "hiddenSize": 64, "numAttentionHeads": 4, "paddedVocabSize": 128}, 64)
NEAR_TIE = [1e-3]  # twice DELTA of the largest logit, set from the worker's figures by the ``layouts`` fixture


def close(got, ref) -> None:
    """Log-probabilities of one row within DELTA of their largest magnitude."""
    np.testing.assert_allclose(got, ref, rtol=0, atol=forward_atol(ref, DELTA))


def greedy_agreement(got: list[list[int]], ref: list[list[int]], gaps: list[list[float]]) -> list[int]:
    """Per row, how many leading tokens ``got`` and ``ref`` share: all of them, or up to a step where the
    reference's top-two logit gap is under ``NEAR_TIE`` (anything else fails). Prints the near ties."""
    near_tie = NEAR_TIE[0]
    agree = []
    for i, (g, r) in enumerate(zip(got, ref)):
        n = next((k for k in range(min(len(g), len(r))) if g[k] != r[k]), None)
        if n is None:
            assert len(g) == len(r), (i, g, r)
            n = len(g)
        else:
            assert gaps[i][n] < near_tie, f"row {i} parts from the reference at {n} without a near tie: {g} {r}"
            print(f"row {i}: a near tie at position {n} (top-two gap {gaps[i][n]:.2e})")
        agree.append(n)
    return agree


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("generate") / "layouts.json"
    cmd = [str(VENV_BIN / "torchrun"), "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
           str(free_port()), str(WORKER), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert_ok(proc)
    result = json.loads(out.read_text())
    NEAR_TIE[0] = 2 * DELTA * result["tp1pp1"]["logit_scale"]
    gaps = [g for row in result["tp1pp1"]["greedy_gaps"] for g in row if g != float("inf")]
    print(f"near tie: a top-two gap under {NEAR_TIE[0]:.1e} (largest |logit| {result['tp1pp1']['logit_scale']:.2f});"
          f" the smallest gap is {min(gaps):.1e}")
    return result


@pytest.mark.engine
@pytest.mark.parametrize("layout", ["tp1pp1", "tp2pp1", "tp1pp2"])
@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_cached_generation_gives_exactly_the_tokens_of_uncached_generation(layouts, layout, mode):
    cached, uncached = layouts[layout][f"{mode}/cache"], layouts[layout][f"{mode}/nocache"]
    if mode == "greedy":
        agree = greedy_agreement(cached["tokens"], uncached["tokens"], layouts["tp1pp1"]["greedy_gaps"])
    else:  # sampling's inverse CDF in vocabulary order: no tie to part at (``pick_tokens``)
        assert cached["tokens"] == uncached["tokens"]
        agree = [len(row) for row in cached["tokens"]]
    assert cached["response_lengths"] == uncached["response_lengths"] == [10] * 4
    for n, got, ref in zip(agree, cached["log_probs"], uncached["log_probs"]):
        close(got[:n], ref[:n])
    for prompt, row in zip(PROMPTS, cached["tokens"]):
        assert row[:len(prompt)] == prompt


@pytest.mark.engine
@pytest.mark.parametrize("layout", ["tp2pp1", "tp1pp2"])
def test_tensor_and_pipeline_parallel_generate_the_tokens_of_one_process(layouts, layout):
    """TP1 decodes with the lean step (``generate/lean_forward.py``); TP2 and PP2, and a model with hooks, fall back
    to the model's own forward, and all of them generate the same tokens."""
    assert layouts["tp1pp1"]["lean step"] and not layouts[layout]["lean step"]
    assert not layouts["tp1pp1"]["lean step, hooked"]
    gaps = layouts["tp1pp1"]["greedy_gaps"]
    for key in ("greedy/cache", "sampled/cache"):
        got, ref = layouts[layout][key], layouts["tp1pp1"][key]
        if key.startswith("greedy"):
            agree = greedy_agreement(got["tokens"], layouts["tp1pp1"]["greedy/nocache"]["tokens"], gaps)
            agree = [min(n, m) for n, m in zip(agree, greedy_agreement(ref["tokens"], layouts["tp1pp1"][
                "greedy/nocache"]["tokens"], gaps))]
        else:
            assert got["tokens"] == ref["tokens"], key
            agree = [len(row) for row in got["tokens"]]
        for n, a, b in zip(agree, got["log_probs"], ref["log_probs"]):
            close(a[:n], b[:n])
    eos, ref = layouts[layout]["greedy/eos"]["responses"], layouts["tp1pp1"]["greedy/eos"]["responses"]
    greedy_agreement(eos, ref, [g[len(p):] for p, g in zip(PROMPTS, gaps)])  # responses: gaps from the prompt's end


@pytest.mark.engine
def test_sampling_differs_from_greedy_and_log_probs_equal_a_full_forward(layouts):
    run = layouts["tp1pp1"]
    assert run["sampled/cache"]["responses"] != run["greedy/cache"]["responses"]
    tokens = torch.tensor(run["sampled/cache"]["tokens"])
    got, full = np.array(run["sampled/cache"]["log_probs"]), np.array(run["full_forward_log_probs"])
    mask = np.zeros(tokens.shape, dtype=bool)
    for i, prompt in enumerate(PROMPTS):
        mask[i, len(prompt):len(prompt) + 10] = True
    close(got[mask], full[mask])
    assert np.all(got[~mask] == 0) and np.all(got[mask] < 0)


@pytest.mark.engine
def test_the_captured_graphs_decode_loop_generates_the_tokens_of_the_eager_one(layouts):
    """On CUDA the decode step replays captured graphs of fixed shapes: power-of-two slots (dead ones fed a dummy
    token) attending over the whole cache. That loop, each graph run eagerly on the CPU, generates the eager
    loop's tokens and log-probabilities, also when a row stops early and the slots outnumber the rows."""
    run = layouts["tp1pp1"]
    gaps = run["greedy_gaps"]
    agree = greedy_agreement(run["graph path/greedy"]["tokens"], run["greedy/cache"]["tokens"], gaps)
    assert run["graph path/sampled"]["tokens"] == run["sampled/cache"]["tokens"]
    for mode, lengths in (("greedy", agree), ("sampled", [len(row) for row in run["sampled/cache"]["tokens"]])):
        for n, got, ref in zip(lengths, run[f"graph path/{mode}"]["log_probs"], run[f"{mode}/cache"]["log_probs"]):
            close(got[:n], ref[:n])
    assert len(run["greedy/eos"]["responses"][1]) == 3  # then 3 rows run on in 4 slots
    greedy_agreement(run["graph path/eos"], run["greedy/eos"]["responses"],
                     [g[len(p):] for p, g in zip(PROMPTS, gaps)])


@pytest.mark.engine
def test_learned_absolute_positions_follow_tokens_into_the_cache(layouts):
    run = layouts["tp1pp1"]
    assert run["learned/cache"] == run["learned/nocache"]
    assert run["learned/cache"] != run["greedy/cache"]["tokens"]  # a different model: positions do matter


@pytest.mark.engine
def test_a_batch_generates_what_each_prompt_generates_alone(layouts):
    """Prompts of different lengths share a batch without changing each other's tokens (no padding leaks)."""
    run = layouts["tp1pp1"]
    gaps = [g[len(p):] for p, g in zip(PROMPTS, run["greedy_gaps"])]
    greedy_agreement(run["greedy/alone"], run["greedy/cache"]["responses"], gaps)


@pytest.mark.engine
@pytest.mark.parametrize("layout", ["tp1pp1", "tp2pp1", "tp1pp2"])
def test_a_row_that_ends_hands_its_slot_to_the_next_prompt(layouts, layout):
    """Four prompts in two slots: at one stage a row that ends gives its cache slot to the next prompt (continuous
    batching), elsewhere the prompts run two at a time; either way every row generates what it does with all four
    in one batch, and each row's end is reported once."""
    run = layouts[layout]
    gaps = [g[len(p):] for p, g in zip(PROMPTS, layouts["tp1pp1"]["greedy_gaps"])]
    for mode in ("greedy", "sampled"):
        whole, slotted = run[f"slots None/{mode}"], run[f"slots 2/{mode}"]
        if mode == "greedy":  # row 1 ends after 3 tokens and row 2 takes its slot (sampled: 2 enter at once)
            assert [len(r) for r in whole["responses"]] == [10, 3, 10, 10]
            agree = greedy_agreement(slotted["responses"], whole["responses"], gaps)
        else:
            assert slotted["responses"] == whole["responses"]
            agree = [len(r) for r in whole["responses"]]
        for n, got, ref in zip(agree, slotted["log_probs"], whole["log_probs"]):
            close(got[:n], ref[:n])
        assert sorted(slotted["ended"]) == [0, 1, 2, 3]
    if layout == "tp1pp1":  # and in the loop a GPU replays from captured graphs
        greedy_agreement(run["graph path/slots 2"], run["slots None/greedy"]["responses"], gaps)


@pytest.mark.engine
def test_rows_stop_at_their_end_of_sequence_token(layouts):
    run = layouts["tp1pp1"]
    eos, full = run["greedy/eos"]["eos"], run["greedy/cache"]["responses"]
    expected = [r[:r.index(eos) + 1] if eos in r else r for r in full]
    assert run["greedy/eos"]["responses"] == expected
    assert len(expected[1]) == 3 and any(len(r) == 10 for r in expected)  # one row stopped early, one ran on
    for prompt, response, row in zip(PROMPTS, expected, run["greedy/eos"]["tokens"]):
        assert row[len(prompt) + len(response):] == [0] * (len(row) - len(prompt) - len(response))  # padded


@pytest.mark.parametrize("ids, mask", [
    ([[0, 0, 5, 6], [7, 8, 9, 1]], [[0, 0, 1, 1], [1, 1, 1, 1]]),   # left padding
    ([[5, 6, 0, 0], [7, 8, 9, 1]], [[1, 1, 0, 0], [1, 1, 1, 1]]),   # right padding
])
def test_left_and_right_padded_batches_give_the_same_prompts(ids, mask):
    assert strip_padding(torch.tensor(ids), torch.tensor(mask)) == [[5, 6], [7, 8, 9, 1]]


def test_padding_inside_a_prompt_is_refused():
    with pytest.raises(ValueError, match="prompt 0: padding inside the prompt"):
        strip_padding(torch.tensor([[5, 0, 6]]), torch.tensor([[1, 0, 1]]))
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        strip_padding(torch.tensor([[5], [0]]), torch.tensor([[1], [0]]))
