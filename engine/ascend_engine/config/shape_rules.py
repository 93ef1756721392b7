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
    """The same numbers as a CEL list (``""`` for a message without figures)."""
    spec_level: bool = False
    megatron: str = ""
    """What megatron-core (or the step it runs) does with a layout this rule refuses, for the docs and tests."""

    def text(self, cfg: Any) -> str:
        return self.message % self.figures(cfg)

    def crd_rule(self) -> dict[str, str]:
        """The CRD's ``x-kubernetes-validations`` entry at the AscendTrainJob spec's level."""
        def cel(text: str) -> str:
            return re.sub(r"\bS\.", "self.", re.sub(r"\bT\.", "self.train.", text))
        # format, never string(int) concatenated: kube-apiserver cannot bound string(int)'s size (api/admission.py)
        figures = {"messageExpression": "'{}'.format({})".format(self.message.replace("'", "\\'"),
                                                                 cel(self.cel_figures))} if self.cel_figures else {}
        return {"rule": f"!has(self.train) || {cel(self.cel)}", **figures,
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
    # What megatron-core refuses while it builds the model and its parallel state, or in the first step, for a
    # reason the spec alone decides (docs/plan.md lists the asserts gone through, these and the unreachable ones).
    _tp_divides("moeSharedExpertIntermediateSize", lambda m: m.moeSharedExpertIntermediateSize or 0,
                "T.model.moeSharedExpertIntermediateSize", only="moeSharedExpertIntermediateSize",
                only_cel="!has(T.model.moeSharedExpertIntermediateSize)"),
    ShapeRule(
        field="parallel.sequenceParallel",
        message="parallel.sequenceParallel needs tensorModelParallelSize > 1",
        ok=lambda c: not c.parallel.sequenceParallel or c.parallel.tensorModelParallelSize > 1,
        figures=lambda c: (), cel=f"(!T.parallel.sequenceParallel || {_TP} > 1)", cel_figures="",
        megatron="ModelParallelConfig: ValueError Cannot use sequence parallelism without tensor parallelism"),
    ShapeRule(
        field="training.seqLength",
        message="training.seqLength (%d) must be a multiple of parallel.tensorModelParallelSize (%d) with "
                "sequenceParallel: megatron-core splits every sequence evenly over the tensor-parallel ranks",
        ok=lambda c: not c.parallel.sequenceParallel or
        c.training.seqLength % c.parallel.tensorModelParallelSize == 0,
        figures=lambda c: (c.training.seqLength, c.parallel.tensorModelParallelSize),
        cel=f"(!T.parallel.sequenceParallel || T.training.seqLength % {_TP} == 0)",
        cel_figures=f"[T.training.seqLength, {_TP}]",
        megatron="first step, the embedding's scatter to the sequence-parallel region: AssertionError First "
                 "dimension of the tensor should be divisible by tensor parallel size"),
    ShapeRule(
        field="data.padToMultipleOf",
        message="data.padToMultipleOf (%d) must be a multiple of parallel.tensorModelParallelSize (%d) with "
                "sequenceParallel and data.variableSeqLengths: each micro-batch is padded to a multiple of it, and "
                "megatron-core splits every sequence evenly over the tensor-parallel ranks",
        ok=lambda c: not (c.parallel.sequenceParallel and c.data.variableSeqLengths) or
        c.data.padToMultipleOf % c.parallel.tensorModelParallelSize == 0,
        figures=lambda c: (c.data.padToMultipleOf, c.parallel.tensorModelParallelSize),
        cel=f"(!T.parallel.sequenceParallel || !T.data.variableSeqLengths || T.data.padToMultipleOf % {_TP} == 0)",
        cel_figures=f"[T.data.padToMultipleOf, {_TP}]",
        megatron="the first micro-batch whose padded length the TP size does not divide: the same AssertionError"),
    ShapeRule(
        field="parallel.sequenceParallel",
        message="stage grpo with parallel.sequenceParallel: the rollouts run prompts of any length, then one token "
                "a step, which megatron-core cannot split over the tensor-parallel ranks (an MoE model trains GRPO "
                "at tensorModelParallelSize 1, with expertModelParallelSize for its experts)",
        ok=lambda c: not (c.stage == "grpo" and c.parallel.sequenceParallel),
        figures=lambda c: (), cel="(!has(T.stage) || T.stage != 'grpo' || !T.parallel.sequenceParallel)",
        cel_figures="",
        megatron="first rollout, the prompt's prefill: AssertionError First dimension of the tensor should be "
                 "divisible by tensor parallel size (reduce-scatter of the embedding)"),
    ShapeRule(
        field="model.maxPositionEmbeddings",
        message="model.maxPositionEmbeddings (%d) must be at least training.seqLength (%d) with "
                "positionEmbeddingType learned_absolute: a position past the table has no embedding",
        ok=lambda c: c.model.positionEmbeddingType != "learned_absolute" or c.model.maxPositionEmbeddings is None
        or c.model.maxPositionEmbeddings >= c.training.seqLength,
        figures=lambda c: (c.model.maxPositionEmbeddings or 0, c.training.seqLength),
        cel="(T.model.positionEmbeddingType != 'learned_absolute' || !has(T.model.maxPositionEmbeddings)"
            " || T.model.maxPositionEmbeddings >= T.training.seqLength)",
        cel_figures="[has(T.model.maxPositionEmbeddings) ? T.model.maxPositionEmbeddings : 0, T.training.seqLength]",
        megatron="first step, LanguageModelEmbedding's position lookup: IndexError index out of range in self"),
    ShapeRule(
        field="model.kvChannels",
        message="model.kvChannels (%d) must be even with positionEmbeddingType rope: RoPE rotates pairs of channels",
        ok=lambda c: c.model.positionEmbeddingType != "rope" or c.model.kvChannels is None
        or c.model.kvChannels % 2 == 0,
        figures=lambda c: (c.model.kvChannels or 0,),
        cel="(T.model.positionEmbeddingType != 'rope' || !has(T.model.kvChannels) || T.model.kvChannels % 2 == 0)",
        cel_figures="[has(T.model.kvChannels) ? T.model.kvChannels : 0]",
        megatron="first step, apply_rotary_pos_emb: RuntimeError The size of tensor a (15) must match the size of "
                 "tensor b (16)"),
    ShapeRule(
        field="model.hiddenSize",
        message="the head dimension (%d = model.hiddenSize / numAttentionHeads) must be even with "
                "positionEmbeddingType rope: RoPE rotates pairs of channels (set kvChannels, or another hiddenSize)",
        ok=lambda c: c.model.positionEmbeddingType != "rope" or c.model.kvChannels is not None
        or c.model.head_dim % 2 == 0,
        figures=lambda c: (c.model.head_dim,),
        # vacuous where hiddenSize / numAttentionHeads is not whole: ModelConfig refuses that first
        cel="(T.model.positionEmbeddingType != 'rope' || has(T.model.kvChannels)"
            " || T.model.hiddenSize % T.model.numAttentionHeads != 0"
            " || (T.model.hiddenSize / T.model.numAttentionHeads) % 2 == 0)",
        cel_figures="[T.model.hiddenSize / T.model.numAttentionHeads]",
        megatron="the same RuntimeError"),
    ShapeRule(
        field="model.addBiasLinear",
        message="model.addBiasLinear with model.numExperts: megatron-core MoE layers take no linear biases (drop "
                "addBiasLinear, or keep addQkvBias for the attention)",
        ok=lambda c: c.model.numExperts is None or not c.model.addBiasLinear,
        figures=lambda c: (), cel="(!has(T.model.numExperts) || !T.model.addBiasLinear)", cel_figures="",
        megatron="TransformerConfig: AssertionError Bias in Moe is only supported when ETP==1 (TP > 1); "
                 "SharedExpertMLP: AssertionError bias is not supported in the shared experts; GroupedMLP: bias "
                 "not supported in Grouped GEMM yet; at TP 1 with several local experts the first step: "
                 "RuntimeError Output 0 of _ReduceFromModelParallelRegion is a view and is being modified inplace"),
    ShapeRule(
        field="model.moeRouterTopk",
        message="model.moeRouterTopk 1 needs model.moeRouterPreSoftmax (or moeRouterLoadBalancingType sinkhorn): "
                "a softmax over a single top-k logit is always 1 and gives the router no gradient",
        ok=lambda c: c.model.numExperts is None or c.model.moeRouterTopk != 1 or c.model.moeRouterPreSoftmax
        or c.model.moeRouterLoadBalancingType == "sinkhorn",
        figures=lambda c: (),
        cel="(!has(T.model.numExperts) || T.model.moeRouterTopk != 1 || T.model.moeRouterPreSoftmax"
            " || T.model.moeRouterLoadBalancingType == 'sinkhorn')",
        cel_figures="", megatron="TransformerConfig: ValueError Please use --moe-router-pre-softmax when topk is 1."),
    ShapeRule(
        field="model.moeAuxLossCoeff",
        message="model.moeAuxLossCoeff must be 0 with moeRouterLoadBalancingType sinkhorn: Sinkhorn routing has no "
                "auxiliary loss",
        ok=lambda c: c.model.numExperts is None or c.model.moeRouterLoadBalancingType != "sinkhorn"
        or c.model.moeAuxLossCoeff == 0,
        figures=lambda c: (),
        cel="(!has(T.model.numExperts) || T.model.moeRouterLoadBalancingType != 'sinkhorn'"
            " || T.model.moeAuxLossCoeff == 0.0)",
        cel_figures="", megatron="first step, TopKRouter.sinkhorn_load_balancing: AssertionError Sinkhorn routing "
                                 "does not support aux loss."),
    ShapeRule(
        field="model.moeTokenDispatcherType",
        message="data.variableSeqLengths needs model.moeTokenDispatcherType alltoall (megatron-core refuses variable "
                "lengths with the allgather dispatcher)",
        ok=lambda c: c.model.numExperts is None or not c.data.variableSeqLengths
        or c.model.moeTokenDispatcherType != "allgather",
        figures=lambda c: (),
        cel="(!has(T.model.numExperts) || !T.data.variableSeqLengths || T.model.moeTokenDispatcherType != 'allgather')",
        cel_figures="", megatron="TransformerConfig: ValueError Token dispatcher type: allgather does not support "
                                 "variable sequence length"),
    ShapeRule(
        field="model.moeGroupedGemm",
        message="model.moeGroupedGemm needs a GPU or NPU grouped GEMM kernel: with device cpu leave it off (the "
                "experts then run one after another, same results)",
        ok=lambda c: not c.model.moeGroupedGemm or c.device != "cpu",
        figures=lambda c: (), cel="(!T.model.moeGroupedGemm || T.device != 'cpu')", cel_figures="",
        megatron="the engine's own refusal while it builds the model (models/gpt.moe_settings)"),
    ShapeRule(
        field="training.precision",
        message="model.moeGroupedGemm needs training.precision bf16: megatron-core grouped-GEMM experts (GroupedMLP) "
                "compute in bf16 only",
        ok=lambda c: not c.model.moeGroupedGemm or c.training.precision == "bf16",
        figures=lambda c: (), cel="(!T.model.moeGroupedGemm || T.training.precision == 'bf16')", cel_figures="",
        megatron="first step, GroupedMLP.forward: AssertionError Currently GroupedMLP for MoE only supports bf16."),
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
