"""How far two float32 computations of the same value may differ: the bound every parity test uses (a layout
against another, the engine against transformers), derived from float32's rounding instead of picked on one CPU.

**One forward pass.** Two computations of one mathematical value differ only by rounding when they add in
different orders: a matmul split over TP ranks and all-reduced, another kernel's blocking (AVX-512 on an Intel Xeon,
AVX2 on an AMD EPYC: oneDNN and MKL block their sums by the vector width), transformers' attention against
megatron-core's. float32 rounds each operation to a relative ``u = 2**-24``. The rounding errors of a sum's K
partial sums behave as independent zero-mean variables, so the sum's error grows as ``sqrt(K) u`` relative to the
size of its terms, not as the worst case ``K u`` (N. J. Higham and T. Mary, "A new approach to probabilistic
rounding error analysis", SIAM J. Sci. Comput. 41(5), 2019). A value computed through D chained reductions (each
layer, then the output layer and the loss) carries at most D of them:

    delta = sqrt(K) * D * u        K: the longest reduction (hidden, FFN, heads x head size, sequence,
                                   padded vocabulary), D: layers + 2

and two forwards agree to ``delta`` times the size of what they compute (``forward_atol``: the largest magnitude
of the compared values, a norm-wise bound as torch.testing's). A logit is summed from terms about its own size,
so this is an absolute bound scaled by the logits' magnitude, not a relative one per element (a logit near zero
is not computed more precisely than its neighbours).

**Training.** Each step's update comes from a gradient that carries ``delta``. Adam divides the gradient by its own
running scale, so the update's error is ``delta`` of the update itself, and the loss moves with the update: the
error a step leaves in the weights moves the loss by ``delta`` times what that step moved it. The weights keep
every step's error, so at step t the two runs' losses differ by at most

    |L_t - L'_t| <= delta * (|L_t| + sum over s <= t of |L_s - L_{s-1}|)        (``curve_atol``)

the forward's own error plus delta of the way the loss has travelled. This bound does not shrink with the loss:
a cross-entropy that has fallen to 0.05 carries the error of the distance it has travelled (the PRM test's
relative 1e-5 failed there on an AMD EPYC, 6.8e-7 at a loss of 0.0461 after the loss had moved by 1.96; the
Intel runs of the same test differ by up to 9e-7 at iteration 7). What ``delta`` leaves out (chaotic growth
over many steps, near-ties that flip a discrete choice) is not rounding-sized: a test where it matters says so
and compares what does not flip.

**The size that counts.** Rounding is relative to the values a result is summed from, which can be far larger than
the result: a DPO reward is beta times a difference of two log-probability sums of about 50, a GRPO loss a mean of
advantage-weighted ratios that cancel to near zero. Those tests pass that size as ``scale`` (``logprob_scale``: n
token log-probabilities of about ln V each, their rounding adding as a random walk, ``sqrt(n) ln V``). Values read
from the engine's log line carry its 7 significant digits too (``printed``).

Measured (issue 49, on an Intel Xeon with AVX-512, and with oneDNN, MKL and ATen held to AVX2 by ``AVX2_ENV``, the
kernel path of an AMD EPYC without AVX-512): one reduction uses up to 0.56 of ``delta(K, 1)``
(tests/unit/test_float_bounds.py); the parity tests' curves and forwards use at most 0.14 of their bounds (the
PRM's TP=2 curve 0.11, where the AMD figure above is 0.08). Errors the tests exist to catch are far outside: the PRM
run with a 1% larger learning rate leaves its bound by up to 1265x, and a neat-packed sequence trained as one
sequence (attention across its samples) moves the loss by about 3e-3 by the fourth step, 100x its bound
(test_train_data.py).
"""
from __future__ import annotations

import math
from typing import Sequence

U = 2.0 ** -24
"""float32's unit roundoff (half its machine epsilon 2**-23)."""

AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
"""Environment that makes an AVX-512 machine add in the order an AVX2-only CPU does (to check a bound on both)."""


def delta(terms: int, depth: int) -> float:
    """Relative difference of two orderings of one computation: ``sqrt(terms) * depth * U``."""
    return math.sqrt(terms) * depth * U


def model_delta(model: dict, seq_length: int, padded_vocab: int | None = None) -> float:
    """``delta`` for a GPT of ``model`` (ModelConfig fields) over ``seq_length`` tokens: K the longest reduction
    of its forward (hidden size, FFN width, heads x head size, sequence, padded vocabulary), D its layers + 2."""
    hidden, heads = model.get("hiddenSize", 64), model.get("numAttentionHeads", 4)
    head = model.get("kvChannels") or hidden // heads
    widths = [hidden, model.get("ffnHiddenSize") or 4 * hidden, model.get("moeFfnHiddenSize") or 0, heads * head,
              seq_length, padded_vocab or model.get("paddedVocabSize") or model.get("vocabSize", 256)]
    return delta(max(widths), model.get("numLayers", 2) + 2)


def forward_atol(reference, d: float) -> float:
    """Norm-wise bound for one forward's values (logits, log-probabilities, scores): ``d`` times their largest
    magnitude."""
    values = [abs(float(v)) for v in _flat(reference)]
    return d * max(values, default=0.0)


def hf_delta(config_json, seq_length: int) -> float:
    """``model_delta`` of a HuggingFace ``config.json`` (a path or its dict), through the engine's own mapping."""
    import json
    from pathlib import Path

    from ascend_engine.convert.hf_config import model_config_from_hf

    hf = config_json if isinstance(config_json, dict) else json.loads(Path(config_json).read_text())
    return model_delta(model_config_from_hf(hf, "config.json").to_yaml_dict(), seq_length)


def decided(logits, atol: float):
    """Mask of the rows (over the last axis) whose top choice leads the runner-up by more than ``2 * atol``: there
    the argmax cannot differ between two computations within ``atol`` of each other; elsewhere it may (a near-tie
    is not a bug)."""
    top = logits.topk(2, dim=-1).values
    return (top[..., 0] - top[..., 1]) > 2 * atol


def printed(value: float) -> float:
    """How far apart two values can read once each is printed with 7 significant digits, as the engine's log
    line prints them (half a unit in the last digit each)."""
    return 0.0 if value == 0 else 10.0 ** (math.floor(math.log10(abs(value))) - 6)


def curve_atol(values: Sequence[float], d: float, scale: float = 0.0, from_log: bool = False) -> list[float]:
    """Per step, the bound on the difference of two training runs' values: ``d * (|v_t| + scale + path
    travelled)``. ``scale``: the size of what the value is computed from where that exceeds the value itself (a
    DPO reward is a difference of log-probability sums, a GRPO loss a mean of advantage-weighted ratios near
    zero). ``from_log``: the values were read from log lines (``printed``)."""
    out, travelled = [], 0.0
    for i, value in enumerate(values):
        if i:
            travelled += abs(value - values[i - 1])
        out.append(d * (abs(value) + scale + travelled) + (printed(value) if from_log else 0.0))
    return out


def logprob_scale(tokens: int, padded_vocab: int) -> float:
    """Size of a sum of ``tokens`` log-probabilities' rounding, in units of ``delta``: each is about log V in
    magnitude while a model is near uniform (these tests train a few steps from random or tiny weights), and their
    errors add as a random walk (the sum is itself a reduction): ``sqrt(tokens) * log(padded_vocab)``."""
    return math.sqrt(tokens) * math.log(padded_vocab)


def assert_curves_agree(reference: Sequence[float], other: Sequence[float], d: float, what: str,
                        scale: float = 0.0, from_log: bool = False) -> float:
    """Every step of ``other`` within ``curve_atol(reference, d, scale, from_log)`` of ``reference``; returns the
    largest share of the bound used (printed by the tests, so a run shows its margin)."""
    assert len(reference) == len(other), (what, len(reference), len(other))
    bounds = curve_atol(reference, d, scale, from_log)
    used = [abs(a - b) / bound if bound else (0.0 if a == b else math.inf)
            for a, b, bound in zip(reference, other, bounds)]
    worst = max(used, default=0.0)
    assert worst <= 1.0, (f"{what}: step {used.index(worst) + 1} differs by {worst:.1f}x its bound; per step "
                          f"(reference, other, bound): {list(zip(reference, other, bounds))}")
    return worst


def _flat(values):
    if hasattr(values, "flatten") and hasattr(values, "tolist"):
        return values.flatten().tolist()
    if isinstance(values, (list, tuple)):
        return [x for v in values for x in _flat(v)]
    return [values]
