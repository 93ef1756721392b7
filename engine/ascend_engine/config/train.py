"""``TrainConfig``: what ``ascend-engine train`` runs and what ``AscendTrainJob.spec.train`` holds.

Field names follow Megatron-LM / MindSpeed-LLM (as camelCase in YAML, as their own flags on the CLI), so a
launch script's flags carry over one to one.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from .base import EngineModel, Flag
from .grpo import GrpoConfig, check_grpo_run
from .preference import PAIRWISE_STAGES, PreferenceConfig, Stage, check_prm_run

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


class ParallelConfig(EngineModel):
    """How the model is split over devices; data parallelism is what remains of the world size."""

    tensorModelParallelSize: Annotated[PositiveInt, Flag("--tensor-model-parallel-size")] = 1
    """Tensor parallel size (TP)."""
    pipelineModelParallelSize: Annotated[PositiveInt, Flag("--pipeline-model-parallel-size")] = 1
    """Pipeline parallel size (PP), scheduled as 1F1B."""
    numLayersPerVirtualPipelineStage: Annotated[PositiveInt | None,
                                                Flag("--num-layers-per-virtual-pipeline-stage")] = None
    """Virtual pipeline stages (interleaved 1F1B): each PP rank holds numLayers / (PP x this) model chunks of this
    many layers, chunk c of rank p being virtual stage c x PP + p; needs PP > 1."""
    expertModelParallelSize: Annotated[PositiveInt, Flag("--expert-model-parallel-size")] = 1
    """Expert parallel size (EP): routed experts are split over EP ranks; expert layers use TP x EP x PP ranks
    (experts are tensor-parallel like the dense MLP, Megatron's default expert tensor parallel size)."""
    useDistributedOptimizer: Annotated[bool, Flag("--use-distributed-optimizer")] = False
    """Shard optimizer state across data-parallel ranks (ZeRO-1)."""
    sequenceParallel: Annotated[bool, Flag("--sequence-parallel")] = False
    """Sequence parallelism with TP (needed for MoE with TP; on CPU the torch norms are marked for it)."""


class TrainingConfig(EngineModel):
    """Batch sizes, length, precision and schedule of the run."""

    microBatchSize: Annotated[PositiveInt, Flag("--micro-batch-size")] = 1
    """Samples per micro-batch per data-parallel rank."""
    globalBatchSize: Annotated[PositiveInt, Flag("--global-batch-size")] = 2
    """Samples per optimizer step over all data-parallel ranks (gradient accumulation fills the gap)."""
    seqLength: Annotated[PositiveInt, Flag("--seq-length")] = 64
    """Tokens per sample."""
    trainIters: Annotated[PositiveInt, Flag("--train-iters")] = 10
    """Optimizer steps to run."""
    exitInterval: Annotated[PositiveInt | None, Flag("--exit-interval")] = None
    """Stop after an iteration that is a multiple of this (saving first when checkpoint.save is set)."""
    seed: Annotated[int, Flag("--seed")] = 1234
    """Random seed for weights, data order and dropout."""
    precision: Annotated[Literal["fp32", "bf16", "fp16"], Flag("--precision")] = "fp32"
    """Training precision; --bf16 and --fp16 are accepted as well."""
    recomputeGranularity: Annotated[Literal["full", "selective"] | None,
                                    Flag("--recompute-granularity")] = None
    """Activation recomputation."""
    evalInterval: Annotated[PositiveInt | None, Flag("--eval-interval")] = None
    """Compute the validation loss every N steps (and after the last) on the validation part of data.split."""
    evalIters: Annotated[int, Field(ge=0), Flag("--eval-iters")] = 10
    """Global batches per validation (the same first samples of the validation part each time); 0 disables."""


class OptimizerConfig(EngineModel):
    """Adam(W) and the learning-rate schedule."""

    optimizer: Annotated[Literal["adam", "sgd"], Flag("--optimizer")] = "adam"
    """Optimizer (adam is AdamW with decoupled weight decay, as in Megatron)."""
    lr: Annotated[float, Field(gt=0), Flag("--lr")] = 1e-3
    """Peak learning rate."""
    minLr: Annotated[float, Field(ge=0), Flag("--min-lr")] = 0.0
    """Learning rate at the end of decay."""
    lrDecayStyle: Annotated[Literal["constant", "linear", "cosine"], Flag("--lr-decay-style")] = "cosine"
    """Decay after warm-up."""
    lrWarmupIters: Annotated[int, Field(ge=0), Flag("--lr-warmup-iters")] = 0
    """Warm-up steps."""
    lrWarmupFraction: Annotated[float | None, Field(ge=0, le=1), Flag("--lr-warmup-fraction")] = None
    """Warm-up as a fraction of trainIters (overrides lrWarmupIters)."""
    weightDecay: Annotated[float, Field(ge=0), Flag("--weight-decay")] = 0.01
    """Decoupled weight decay."""
    clipGrad: Annotated[float, Field(ge=0), Flag("--clip-grad")] = 1.0
    """Global gradient-norm clipping (0 disables)."""
    adamBeta1: Annotated[float, Field(gt=0, lt=1), Flag("--adam-beta1")] = 0.9
    """Adam beta1."""
    adamBeta2: Annotated[float, Field(gt=0, lt=1), Flag("--adam-beta2")] = 0.95
    """Adam beta2."""
    adamEps: Annotated[float, Field(gt=0), Flag("--adam-eps")] = 1e-8
    """Adam epsilon."""
    overrideOptParamScheduler: Annotated[bool, Flag("--override-opt-param-scheduler")] = False
    """On resume, continue with this run's learning-rate and weight-decay schedule (lr, minLr, warm-up, decay
    style, trainIters) where it differs from the checkpoint's; the step count still comes from the checkpoint.
    Without this or useCheckpointOptParamScheduler a differing schedule is an error."""
    useCheckpointOptParamScheduler: Annotated[bool, Flag("--use-checkpoint-opt-param-scheduler")] = False
    """On resume, keep the checkpoint's learning-rate and weight-decay schedule and ignore this run's."""

    @model_validator(mode="after")
    def _one_schedule_source(self) -> "OptimizerConfig":
        if self.overrideOptParamScheduler and self.useCheckpointOptParamScheduler:
            raise ValueError("overrideOptParamScheduler and useCheckpointOptParamScheduler exclude each other: "
                             "pick this run's schedule or the checkpoint's")
        return self


class DataConfig(EngineModel):
    """Training data: indexed-dataset prefixes, or a synthetic learnable sequence when none are given."""

    dataPath: Annotated[list[str], Flag("--data-path")] = []
    """Dataset prefixes (not file names), optionally weighted: ["0.7", "a_text_document", "0.3", "b"]."""
    tokenizerNameOrPath: Annotated[str | None, Flag("--tokenizer-name-or-path")] = None
    """The run's HuggingFace tokenizer directory (MindSpeed's --tokenizer-name-or-path). Stage grpo needs it: it
    decodes the rollouts for the rewards, and its EOS token ends a response."""
    split: Annotated[str, Flag("--split")] = "100,0,0"
    """Train/valid/test split of each dataset."""
    mockData: Annotated[bool, Flag("--mock-data")] = False
    """Train on synthetic data (a learnable repeating token pattern); implied when dataPath is empty."""
    isInstructionDataset: Annotated[bool, Flag("--is-instruction-dataset")] = False
    """dataPath holds instruction data (<prefix>_packed_{input_ids,attention_mask,labels}_document): the loss
    counts only tokens whose label is not -100 (the responses)."""
    variableSeqLengths: Annotated[bool, Flag("--variable-seq-lengths")] = False
    """Instruction data: pad each micro-batch only to its longest sample (rounded up to padToMultipleOf, at most
    seqLength) instead of to seqLength."""
    padToMultipleOf: Annotated[PositiveInt, Flag("--pad-to-multiple-of")] = 8
    """Instruction data with variableSeqLengths: round micro-batch lengths up to a multiple of this."""
    isPairwiseDataset: Annotated[bool, Flag("--is-pairwise-dataset")] = False
    """dataPath holds preference pairs (<prefix>_packed_{chosen,rejected}_{input_ids,attention_mask,labels}_document),
    as the dpo and simpo stages always read (MindSpeed-LLM's flag, accepted for their launch scripts)."""
    neatPack: Annotated[bool, Flag("--neat-pack")] = False
    """Instruction data prepared with neatPack: attention and positions stay inside each packed sample (the
    attention mask numbers the samples 1..k, 0 for padding)."""

    @model_validator(mode="after")
    def _instruction_only(self) -> "DataConfig":
        if self.neatPack and self.isPairwiseDataset:
            raise ValueError("neatPack does not apply to pairwise data (each pair is one sequence per side)")
        for name in ("variableSeqLengths", "neatPack"):
            if getattr(self, name) and not (self.isInstructionDataset or self.isPairwiseDataset):
                raise ValueError(f"{name} applies to instruction data: set isInstructionDataset "
                                 "(--is-instruction-dataset)")
        return self


class CheckpointConfig(EngineModel):
    """Megatron checkpoint layout: ``<save>/iter_0000010/mp_rank_00[_000]/model_optim_rng.pt``."""

    save: Annotated[str | None, Flag("--save")] = None
    """Directory to save checkpoints to."""
    saveInterval: Annotated[PositiveInt | None, Flag("--save-interval")] = None
    """Save every N steps (and always at the end when save is set)."""
    load: Annotated[str | None, Flag("--load")] = None
    """Directory to resume or start from."""
    finetune: Annotated[bool, Flag("--finetune")] = False
    """Load weights only and start at iteration 0."""
    loadOptim: Annotated[bool, Flag("--no-load-optim", invert=True)] = True
    """Restore optimizer state when loading."""
    loadRng: Annotated[bool, Flag("--no-load-rng", invert=True)] = True
    """Restore random-number-generator state when loading."""


LoraTarget = Literal["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]


class LoraConfig(EngineModel):
    """LoRA fine-tuning (MindSpeed-LLM's flags): the base stays frozen, only the adapters train and are saved."""

    loraR: Annotated[PositiveInt | None, Flag("--lora-r")] = None
    """Adapter rank; setting it turns LoRA on."""
    loraAlpha: Annotated[float, Field(gt=0), Flag("--lora-alpha")] = 32.0
    """Scale of the update: W + (loraAlpha / loraR) * B @ A."""
    loraDropout: Annotated[float, Field(ge=0, lt=1), Flag("--lora-dropout")] = 0.0
    """Dropout on the adapter's input."""
    loraTargetModules: Annotated[list[LoraTarget], Flag("--lora-target-modules")] = []
    """Linear layers that get an adapter."""
    loraLoad: Annotated[str | None, Flag("--lora-load")] = None
    """Adapter checkpoint to resume from (iteration, optimizer, RNG, data position); checkpoint.load is the
    frozen base."""

    @property
    def enabled(self) -> bool:
        return self.loraR is not None

    @model_validator(mode="after")
    def _targets(self) -> "LoraConfig":
        if self.enabled and not self.loraTargetModules:
            raise ValueError("loraR needs loraTargetModules (linear_qkv, linear_proj, linear_fc1, linear_fc2)")
        if not self.enabled and (self.loraTargetModules or self.loraLoad):
            raise ValueError("loraTargetModules / loraLoad need loraR")
        return self


class ObservabilityConfig(EngineModel):
    """Logs and the rank-0 metrics endpoint the operator reads."""

    logInterval: Annotated[PositiveInt, Flag("--log-interval")] = 1
    """Log a line every N steps."""
    metricsPort: Annotated[int | None, Field(ge=1, le=65535), Flag("--metrics-port")] = 9400
    """Port of rank 0's Prometheus endpoint (null disables)."""
    tensorboardDir: Annotated[str | None, Flag("--tensorboard-dir")] = None
    """Write TensorBoard scalars here."""


class TrainConfig(EngineModel):
    """Everything ``ascend-engine train`` needs; ``AscendTrainJob.spec.train`` is this model."""

    device: Annotated[Literal["auto", "npu", "cuda", "cpu"], Flag("--device")] = "auto"
    """Accelerator backend; auto picks npu, then cuda, then cpu."""
    stage: Annotated[Stage | None, Flag("--stage")] = None
    """Training objective: pretrain or sft (the next-token loss; which one follows data.isInstructionDataset), dpo
    or simpo (preference pairs from pairwise data), grpo (rollouts on R1 prompt data scored by rule rewards)."""
    model: ModelConfig = ModelConfig()
    """Model architecture."""
    parallel: ParallelConfig = ParallelConfig()
    """Parallelism."""
    training: TrainingConfig = TrainingConfig()
    """Batch, sequence, steps and precision."""
    optimizer: OptimizerConfig = OptimizerConfig()
    """Optimizer and learning-rate schedule."""
    data: DataConfig = DataConfig()
    """Training data."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """Saving and loading."""
    lora: LoraConfig = LoraConfig()
    """LoRA adapters (off unless loraR is set)."""
    preference: PreferenceConfig = PreferenceConfig()
    """DPO / SimPO objective (stage dpo or simpo)."""
    grpo: GrpoConfig = GrpoConfig()
    """GRPO rollouts, rewards and updates (stage grpo)."""
    observability: ObservabilityConfig = ObservabilityConfig()
    """Logging and metrics."""

    @model_validator(mode="after")
    def _consistent(self) -> "TrainConfig":
        m, p, t = self.model, self.parallel, self.training
        tp, pp = p.tensorModelParallelSize, p.pipelineModelParallelSize
        for name, value in (("numAttentionHeads", m.numAttentionHeads), ("numQueryGroups", m.num_query_groups),
                            ("ffnHiddenSize", m.ffn_hidden_size)):
            if value % tp:
                raise ValueError(f"parallel.tensorModelParallelSize ({tp}) must divide model.{name} ({value})")
        ep = p.expertModelParallelSize
        if ep > 1 and m.numExperts is None:
            raise ValueError(f"parallel.expertModelParallelSize ({ep}) needs model.numExperts (an MoE model)")
        if m.numExperts is not None:
            if m.numExperts % ep:
                raise ValueError(f"parallel.expertModelParallelSize ({ep}) must divide model.numExperts "
                                 f"({m.numExperts})")
            if m.moe_ffn_hidden_size % tp:
                raise ValueError(f"parallel.tensorModelParallelSize ({tp}) must divide model.moeFfnHiddenSize "
                                 f"({m.moe_ffn_hidden_size})")
            if self.data.variableSeqLengths and m.moeTokenDispatcherType == "allgather":
                raise ValueError("data.variableSeqLengths needs model.moeTokenDispatcherType alltoall "
                                 "(megatron-core refuses variable lengths with the allgather dispatcher)")
        if m.numLayers % pp:
            raise ValueError(f"parallel.pipelineModelParallelSize ({pp}) must divide model.numLayers ({m.numLayers})")
        per_chunk = p.numLayersPerVirtualPipelineStage
        if per_chunk is not None and (pp == 1 or m.numLayers % (pp * per_chunk) or m.numLayers // (pp * per_chunk) < 2):
            raise ValueError(f"parallel.numLayersPerVirtualPipelineStage ({per_chunk}) needs pipelineModelParallelSize "
                             f"> 1 and model.numLayers ({m.numLayers}) a multiple of 2 x pipelineModelParallelSize "
                             f"({pp}) x numLayersPerVirtualPipelineStage (at least two chunks per stage)")
        if t.globalBatchSize % t.microBatchSize:
            raise ValueError(f"training.globalBatchSize ({t.globalBatchSize}) must be a multiple of "
                             f"training.microBatchSize ({t.microBatchSize})")
        o = self.optimizer
        warmup = int(o.lrWarmupFraction * t.trainIters) if o.lrWarmupFraction is not None else o.lrWarmupIters
        if warmup >= t.trainIters:
            raise ValueError(f"optimizer warm-up ({warmup} iterations) must be shorter than "
                             f"training.trainIters ({t.trainIters})")
        if self.data.isPairwiseDataset and self.stage not in PAIRWISE_STAGES:
            raise ValueError(f"data.isPairwiseDataset (--is-pairwise-dataset) needs stage "
                             f"{' or '.join(PAIRWISE_STAGES)}, not {self.stage}")
        if self.stage == "grpo":
            check_grpo_run(self)
        if self.stage == "prm":
            check_prm_run(self)
        if self.stage == "orm":
            m.scoreHead = True
        elif m.scoreHead:
            raise ValueError(f"model.scoreHead (--score-head) is the reward model of stage orm, not {self.stage}")
        if m.scoreHead and p.sequenceParallel:
            raise ValueError("stage orm with parallel.sequenceParallel: the score head reads whole sequences; "
                             "turn sequence parallelism off")
        if p.sequenceParallel and tp == 1:
            raise ValueError("parallel.sequenceParallel needs tensorModelParallelSize > 1")
        if self.stage in (*PAIRWISE_STAGES, "grpo") and p.numLayersPerVirtualPipelineStage:
            raise ValueError(f"stage {self.stage} with parallel.numLayersPerVirtualPipelineStage: the preference and "
                             "GRPO stages run the non-interleaved pipeline schedule only; drop the virtual pipeline "
                             "stages")
        return self

    @property
    def pairwise_data(self) -> bool:
        """The dpo and simpo stages read preference pairs (with or without --is-pairwise-dataset)."""
        return self.data.isPairwiseDataset or self.stage in PAIRWISE_STAGES

    @property
    def virtual_pipeline_size(self) -> int | None:
        """Model chunks per pipeline rank (Megatron's virtual_pipeline_model_parallel_size); None without VPP."""
        per_chunk = self.parallel.numLayersPerVirtualPipelineStage
        return None if per_chunk is None else self.model.numLayers // (self.parallel.pipelineModelParallelSize * per_chunk)

    def check_world_size(self, world_size: int) -> int:
        """Validate against the launched world; returns the data-parallel size."""
        tp, pp = self.parallel.tensorModelParallelSize, self.parallel.pipelineModelParallelSize
        ep = self.parallel.expertModelParallelSize
        if world_size % (tp * pp):
            raise ValueError(f"world size {world_size} (nnodes x nprocPerNode) is not divisible by "
                             f"tensorModelParallelSize x pipelineModelParallelSize = {tp} x {pp}")
        if world_size % (tp * pp * ep):
            raise ValueError(f"world size {world_size} (nnodes x nprocPerNode) is not divisible by "
                             f"tensorModelParallelSize x pipelineModelParallelSize x expertModelParallelSize = "
                             f"{tp} x {pp} x {ep} (the expert layers' ranks)")
        dp = world_size // (tp * pp)
        per_step = self.training.microBatchSize * dp
        if self.training.globalBatchSize % per_step:
            raise ValueError(f"training.globalBatchSize ({self.training.globalBatchSize}) must be a multiple of "
                             f"microBatchSize x data-parallel size = {self.training.microBatchSize} x {dp}")
        micro, pp = self.training.globalBatchSize // per_step, self.parallel.pipelineModelParallelSize
        if self.virtual_pipeline_size and micro % pp:
            raise ValueError(f"the interleaved schedule (numLayersPerVirtualPipelineStage) needs the micro-batches per "
                             f"step ({micro} = globalBatchSize / (microBatchSize x data-parallel size)) to be a "
                             f"multiple of pipelineModelParallelSize ({pp})")
        return dp
