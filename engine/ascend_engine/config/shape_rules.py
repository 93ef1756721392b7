"""The layout's shape checks, written once for the two places that make them: ``TrainConfig`` (the engine and the
operator parse a spec with it) and the AscendTrainJob CRD (CEL rules, so ``kubectl apply`` refuses a layout that
cannot be split before anything exists).

Each row holds the check in Python and in CEL, with one message (a printf format with ``%d`` for its figures)
that both fill with the same figures, so kube-apiserver and the engine say the same words and numbers.
``tests/unit/test_shape_rules.py`` evaluates every row both ways over a grid of layouts and requires the same
verdict and the same message. In the CEL text ``T`` stands for ``self.train`` and ``S`` for the job's ``spec``
(``self`` at the spec's level); fields with a pydantic default are always present in a stored object (the CRD
schema defaults them), ``None``-default ones only when written, hence the ``has()``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

# CEL for the model's derived sizes (ModelConfig.num_query_groups, ffn_hidden_size, moe_ffn_hidden_size).
_QUERY_GROUPS = ("(T.model.groupQueryAttention && has(T.model.numQueryGroups) ? T.model.numQueryGroups"
                 " : T.model.numAttentionHeads)")
_FFN = "(has(T.model.ffnHiddenSize) ? T.model.ffnHiddenSize : 4 * T.model.hiddenSize)"
_MOE_FFN = f"(has(T.model.moeFfnHiddenSize) ? T.model.moeFfnHiddenSize : {_FFN})"
_TP = "T.parallel.tensorModelParallelSize"
_PP = "T.parallel.pipelineModelParallelSize"
_VPP = "T.parallel.numLayersPerVirtualPipelineStage"


@dataclass(frozen=True)
class ShapeRule:
    field: str
    """The field the message is about, under ``spec.train`` (``spec`` for rules marked ``spec_level``)."""
    message: str
    """printf format: ``%d`` for each of ``figures``."""
    ok: Callable[[Any], bool]
    """The check on a TrainConfig (on the job's spec for ``spec_level`` rules)."""
    figures: Callable[[Any], tuple[int, ...]]
    """The numbers the message names."""
    cel: str
    """The same check in CEL."""
    cel_figures: str
    """The same numbers as a CEL list."""
    spec_level: bool = False

    def text(self, cfg: Any) -> str:
        return self.message % self.figures(cfg)

    def crd_rule(self) -> dict[str, str]:
        """The CRD's ``x-kubernetes-validations`` entry at the AscendTrainJob spec's level."""
        def cel(text: str) -> str:
            return re.sub(r"\bS\.", "self.", re.sub(r"\bT\.", "self.train.", text))
        # format, never string(int) concatenated: kube-apiserver cannot bound string(int)'s size (api/admission.py)
        return {"rule": f"!has(self.train) || {cel(self.cel)}",
                "messageExpression": f"'{self.message}'.format({cel(self.cel_figures)})",
                "message": re.sub(r" ?\(%d\)", "", self.message).replace("%d = ", ""),  # without the figures
                "fieldPath": "." + ("" if self.spec_level else "train.") + self.field,
                "reason": "FieldValueInvalid"}


def _tp_divides(what: str, value: Callable[[Any], int], cel_value: str, only: str | None = None,
                only_cel: str | None = None) -> ShapeRule:
    return ShapeRule(
        field="parallel.tensorModelParallelSize",
        message=f"parallel.tensorModelParallelSize (%d) must divide model.{what} (%d)",
        ok=lambda c: (only is not None and getattr(c.model, only) is None) or
        value(c.model) % c.parallel.tensorModelParallelSize == 0,
        figures=lambda c: (c.parallel.tensorModelParallelSize, value(c.model)),
        cel=(f"({only_cel} || " if only_cel else "(") + f"{cel_value} % {_TP} == 0)",
        cel_figures=f"[{_TP}, {cel_value}]")


SHAPE_RULES: list[ShapeRule] = [
    _tp_divides("numAttentionHeads", lambda m: m.numAttentionHeads, "T.model.numAttentionHeads"),
    _tp_divides("numQueryGroups", lambda m: m.num_query_groups, _QUERY_GROUPS),
    _tp_divides("ffnHiddenSize", lambda m: m.ffn_hidden_size, _FFN),
    _tp_divides("moeFfnHiddenSize", lambda m: m.moe_ffn_hidden_size, _MOE_FFN, only="numExperts",
                only_cel="!has(T.model.numExperts)"),
    # Megatron's vocab-parallel embedding splits the (padded) vocabulary evenly over the TP ranks; without
    # paddedVocabSize the padding (makeVocabSizeDivisibleBy x TP) makes it so.
    _tp_divides("paddedVocabSize", lambda m: m.paddedVocabSize or 0, "T.model.paddedVocabSize",
                only="paddedVocabSize", only_cel="!has(T.model.paddedVocabSize)"),
    ShapeRule(
        field="parallel.pipelineModelParallelSize",
        message="parallel.pipelineModelParallelSize (%d) must divide model.numLayers (%d)",
        ok=lambda c: c.model.numLayers % c.parallel.pipelineModelParallelSize == 0,
        figures=lambda c: (c.parallel.pipelineModelParallelSize, c.model.numLayers),
        cel=f"T.model.numLayers % {_PP} == 0",
        cel_figures=f"[{_PP}, T.model.numLayers]"),
    ShapeRule(
        field="parallel.numLayersPerVirtualPipelineStage",
        message="parallel.numLayersPerVirtualPipelineStage (%d) needs pipelineModelParallelSize > 1 and "
                "model.numLayers (%d) a multiple of 2 x pipelineModelParallelSize (%d) x "
                "numLayersPerVirtualPipelineStage (at least two chunks per stage)",
        ok=lambda c: (v := c.parallel.numLayersPerVirtualPipelineStage) is None or (
            (p := c.parallel.pipelineModelParallelSize) > 1 and c.model.numLayers % (p * v) == 0
            and c.model.numLayers // (p * v) >= 2),
        figures=lambda c: (c.parallel.numLayersPerVirtualPipelineStage or 0, c.model.numLayers,
                           c.parallel.pipelineModelParallelSize),
        cel=f"(!has({_VPP}) || ({_PP} > 1 && T.model.numLayers % ({_PP} * {_VPP}) == 0"
            f" && T.model.numLayers / ({_PP} * {_VPP}) >= 2))",
        cel_figures=f"[has({_VPP}) ? {_VPP} : 0, T.model.numLayers, {_PP}]"),
    ShapeRule(
        field="training.globalBatchSize",
        message="training.globalBatchSize (%d) must be a multiple of training.microBatchSize (%d)",
        ok=lambda c: c.training.globalBatchSize % c.training.microBatchSize == 0,
        figures=lambda c: (c.training.globalBatchSize, c.training.microBatchSize),
        cel="T.training.globalBatchSize % T.training.microBatchSize == 0",
        cel_figures="[T.training.globalBatchSize, T.training.microBatchSize]"),
]

# The interleaved schedule's micro-batch rule needs the world size, so it is the job's (spec level); the engine
# makes the same check in TrainConfig.check_world_size. Vacuous when the world or the batch rule already fails.
_WORLD = "(S.nnodes * S.nprocPerNode)"
_DP = f"({_WORLD} / ({_TP} * {_PP}))"
_MICRO = f"(T.training.globalBatchSize / (T.training.microBatchSize * {_DP}))"


def _micro(spec: Any) -> int:
    t, p = spec.train.training, spec.train.parallel
    return t.globalBatchSize // (t.microBatchSize * (spec.world_size // (p.tensorModelParallelSize *
                                                                         p.pipelineModelParallelSize)))


SPEC_RULES: list[ShapeRule] = [
    ShapeRule(
        field="train.training.globalBatchSize", spec_level=True,
        message="the interleaved schedule (numLayersPerVirtualPipelineStage) needs the micro-batches per step "
                "(%d = globalBatchSize / (microBatchSize x data-parallel size)) to be a multiple of "
                "pipelineModelParallelSize (%d)",
        ok=lambda s: s.train.parallel.numLayersPerVirtualPipelineStage is None or
        _micro(s) % s.train.parallel.pipelineModelParallelSize == 0,
        figures=lambda s: (_micro(s), s.train.parallel.pipelineModelParallelSize),
        cel=f"(!has({_VPP}) || {_WORLD} % ({_TP} * {_PP}) != 0"
            f" || T.training.globalBatchSize % (T.training.microBatchSize * {_DP}) != 0 || {_MICRO} % {_PP} == 0)",
        cel_figures=f"[{_MICRO}, {_PP}]"),
]


def first_broken(cfg: Any, rules: list[ShapeRule] = SHAPE_RULES) -> str | None:
    """The message of the first rule ``cfg`` breaks, or None."""
    return next((rule.text(cfg) for rule in rules if not rule.ok(cfg)), None)
