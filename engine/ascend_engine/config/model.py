"""``ModelConfig``: the transformer's shape, shared by training, conversion, generation and evaluation.

A module of its own so that a command needing only the shape (``ascend-engine convert``) does not build every
training config model at start-up.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from .base import EngineModel, Flag

PositiveInt = Annotated[int, Field(ge=1)]


class ModelConfig(EngineModel):
    """Transformer shape, as Megatron's GPTModel takes it."""

    numLayers: Annotated[PositiveInt, Flag("--num-layers")] = 2
    """Number of transformer layers."""
    hiddenSize: Annotated[PositiveInt, Flag("--hidden-size")] = 64
    """Hidden size."""
    ffnHiddenSize: Annotated[PositiveInt | None, Flag("--ffn-hidden-size")] = None
    """MLP hidden size; default 4 x hiddenSize."""
    numAttentionHeads: Annotated[PositiveInt, Flag("--num-attention-heads")] = 4
    """Number of attention heads."""
    groupQueryAttention: Annotated[bool, Flag("--group-query-attention")] = False
    """Use grouped-query attention with numQueryGroups key/value heads."""
    numQueryGroups: Annotated[PositiveInt | None, Flag("--num-query-groups")] = None
    """Key/value head groups for GQA; default numAttentionHeads (plain multi-head attention)."""
    kvChannels: Annotated[PositiveInt | None, Flag("--kv-channels")] = None
    """Head dimension; default hiddenSize / numAttentionHeads (Qwen3 sets 128 explicitly)."""
    maxPositionEmbeddings: Annotated[PositiveInt | None, Flag("--max-position-embeddings")] = None
    """Longest sequence the position embedding covers; default the training seqLength."""
    vocabSize: Annotated[PositiveInt, Flag("--vocab-size")] = 256
    """Tokenizer vocabulary size (before padding)."""
    paddedVocabSize: Annotated[PositiveInt | None, Flag("--padded-vocab-size")] = None
    """Exact padded vocabulary size; overrides makeVocabSizeDivisibleBy."""
    makeVocabSizeDivisibleBy: Annotated[PositiveInt, Flag("--make-vocab-size-divisible-by")] = 128
    """Pad the vocabulary to a multiple of this value times tensorModelParallelSize."""
    normalization: Annotated[Literal["RMSNorm", "LayerNorm"], Flag("--normalization")] = "RMSNorm"
    """Normalization layer."""
    normEpsilon: Annotated[float, Field(gt=0), Flag("--norm-epsilon")] = 1e-6
    """Epsilon of the normalization layers."""
    swiglu: Annotated[bool, Flag("--swiglu")] = True
    """SwiGLU MLP (gate and up projections)."""
    positionEmbeddingType: Annotated[Literal["rope", "learned_absolute", "none"],
                                     Flag("--position-embedding-type")] = "rope"
    """Position embedding."""
    rotaryBase: Annotated[float, Field(gt=0), Flag("--rotary-base")] = 10000.0
    """RoPE base frequency (Qwen3 uses 1000000)."""
    qkLayernorm: Annotated[bool, Flag("--qk-layernorm")] = False
    """RMSNorm on queries and keys per head (Qwen3)."""
    addQkvBias: Annotated[bool, Flag("--add-qkv-bias")] = False
    """Bias on the fused QKV projection only (Qwen2/2.5)."""
    addBiasLinear: Annotated[bool, Flag("--add-bias-linear"), Flag("--disable-bias-linear", invert=True)] = False
    """Biases on all linear layers; --disable-bias-linear (the default) turns them off."""
    untieEmbeddingsAndOutputWeights: Annotated[bool, Flag("--untie-embeddings-and-output-weights")] = True
    """Separate output layer instead of sharing the input embedding."""
    scoreHead: Annotated[bool, Flag("--score-head")] = False
    """A scalar score head (hidden -> 1, HF ``score.weight``) in place of the LM output layer: a reward model, as
    HF's ``*ForSequenceClassification`` with one label. Set by stage orm; checkpoints record it."""
    attentionDropout: Annotated[float, Field(ge=0, lt=1), Flag("--attention-dropout")] = 0.0
    """Dropout on attention probabilities."""
    hiddenDropout: Annotated[float, Field(ge=0, lt=1), Flag("--hidden-dropout")] = 0.0
    """Dropout on hidden states."""
    initMethodStd: Annotated[float, Field(gt=0), Flag("--init-method-std")] = 0.02
    """Standard deviation of the weight initialisation."""
    numExperts: Annotated[PositiveInt | None, Flag("--num-experts")] = None
    """Mixture of experts: routed experts per MoE layer (megatron-core's MoELayer); unset for a dense model."""
    moeRouterTopk: Annotated[PositiveInt, Flag("--moe-router-topk")] = 2
    """Experts each token is routed to."""
    moeFfnHiddenSize: Annotated[PositiveInt | None, Flag("--moe-ffn-hidden-size")] = None
    """Hidden size of each routed expert's MLP; default ffnHiddenSize."""
    moeRouterPreSoftmax: Annotated[bool, Flag("--moe-router-pre-softmax")] = False
    """Softmax over all experts before top-k, probabilities not renormalised (Qwen2-MoE, norm_topk_prob false);
    default: softmax over the top-k logits (equal to Mixtral's / Qwen3-MoE's renormalised top-k)."""
    moeAuxLossCoeff: Annotated[float, Field(ge=0), Flag("--moe-aux-loss-coeff")] = 0.0
    """Weight of the load-balancing (auxiliary) loss."""
    moeRouterLoadBalancingType: Annotated[Literal["aux_loss", "seq_aux_loss", "sinkhorn", "none"],
                                          Flag("--moe-router-load-balancing-type")] = "aux_loss"
    """Load-balancing strategy of the router."""
    moeZLossCoeff: Annotated[float | None, Field(ge=0), Flag("--moe-z-loss-coeff")] = None
    """Weight of the router z-loss (unset: none)."""
    moeTokenDispatcherType: Annotated[Literal["alltoall", "allgather"], Flag("--moe-token-dispatcher-type")] = \
        "alltoall"
    """How tokens reach the expert-parallel ranks holding their experts."""
    moeGroupedGemm: Annotated[bool, Flag("--moe-grouped-gemm")] = False
    """One grouped GEMM for all local experts (GPU/NPU only; refused on CPU)."""
    moeSharedExpertIntermediateSize: Annotated[PositiveInt | None,
                                               Flag("--moe-shared-expert-intermediate-size")] = None
    """Hidden size of the shared expert every token also goes through (Qwen2-MoE); unset: none."""
    moeSharedExpertGate: Annotated[bool, Flag("--moe-shared-expert-gate", "--shared-expert-gate")] = False
    """Scale the shared expert's output by sigmoid(x . w) (Qwen2-MoE's shared_expert_gate)."""
    moeLayerFreq: Annotated[PositiveInt, Flag("--moe-layer-freq")] = 1
    """Every moeLayerFreq-th layer is an MoE layer (layer i when i % moeLayerFreq == 0), the rest dense."""

    @property
    def num_query_groups(self) -> int:
        return self.numQueryGroups if self.groupQueryAttention and self.numQueryGroups else self.numAttentionHeads

    @property
    def head_dim(self) -> int:
        return self.kvChannels or self.hiddenSize // self.numAttentionHeads

    @property
    def ffn_hidden_size(self) -> int:
        return self.ffnHiddenSize or 4 * self.hiddenSize

    @property
    def moe_ffn_hidden_size(self) -> int:
        return self.moeFfnHiddenSize or self.ffn_hidden_size

    @property
    def active_ffn_hidden_size(self) -> int:
        """MLP width one token passes through (for FLOPs): its top-k experts and the shared expert in MoE layers."""
        if self.numExperts is None:
            return self.ffn_hidden_size
        return self.moeRouterTopk * self.moe_ffn_hidden_size + (self.moeSharedExpertIntermediateSize or 0)

    def is_moe_layer(self, layer: int) -> bool:
        """Whether global layer ``layer`` (0-based) has routed experts (Megatron's integer moe_layer_freq)."""
        return self.numExperts is not None and layer % self.moeLayerFreq == 0

    def padded_vocab_size(self, tensor_parallel: int) -> int:
        if self.paddedVocabSize:
            return self.paddedVocabSize
        multiple = self.makeVocabSizeDivisibleBy * tensor_parallel
        return -(-self.vocabSize // multiple) * multiple

    @model_validator(mode="after")
    def _shape(self) -> "ModelConfig":
        if self.numAttentionHeads % self.num_query_groups:
            raise ValueError(f"numAttentionHeads ({self.numAttentionHeads}) must be divisible by "
                             f"numQueryGroups ({self.num_query_groups})")
        if self.kvChannels is None and self.hiddenSize % self.numAttentionHeads:
            raise ValueError(f"hiddenSize ({self.hiddenSize}) must be divisible by numAttentionHeads "
                             f"({self.numAttentionHeads}) unless kvChannels is set")
        if self.numExperts is not None and self.moeRouterTopk > self.numExperts:
            raise ValueError(f"moeRouterTopk ({self.moeRouterTopk}) exceeds numExperts ({self.numExperts})")
        if self.numExperts is None and (self.moeSharedExpertIntermediateSize or self.moeGroupedGemm):
            raise ValueError("moeSharedExpertIntermediateSize / moeGroupedGemm need numExperts (--num-experts)")
        if self.moeSharedExpertGate and not self.moeSharedExpertIntermediateSize:
            raise ValueError("moeSharedExpertGate needs moeSharedExpertIntermediateSize")
        return self
