"""``TrainConfig``: what ``ascend-engine train`` runs and what ``AscendTrainJob.spec.train`` holds.

Field names follow Megatron-LM / MindSpeed-LLM (as camelCase in YAML, as their own flags on the CLI), so a
launch script's flags carry over one to one.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from .base import EngineModel, Flag, not_null
from .grpo import GrpoConfig, check_grpo_run
from .model import ModelConfig, PositiveInt
from .preference import PAIRWISE_STAGES, PreferenceConfig, Stage, check_prm_run
from .shape_rules import first_broken
from .tracking import LIST_SCHEMA as TRACKER_LIST_SCHEMA, TrackerConfig, check_trackers

__all__ = ["ModelConfig"]  # re-exported: ``from ascend_engine.config.train import ModelConfig`` keeps working


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
    asyncSave: Annotated[bool, Flag("--no-async-save", invert=True)] = True
    """Write checkpoints in the background: the step after a save starts once the state is copied to host
    memory, and the checkpoint becomes ``latest`` at a later step boundary when every rank's files are on disk
    (always before the run ends or stops on SIGTERM)."""
    keepLastCheckpoints: Annotated[int | None, Field(ge=0), Flag("--keep-last-checkpoints")] = None
    """Keep only this many newest checkpoints in ``save`` (the latest included); 0 or unset keeps all, as
    Megatron-LM does."""


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
    metricsPort: Annotated[int, Field(ge=0, le=65535), not_null("0 to disable"), Flag("--metrics-port")] = 9400
    """Port of rank 0's Prometheus endpoint (0 disables)."""
    tensorboardDir: Annotated[str | None, Flag("--tensorboard-dir")] = None
    """Write TensorBoard scalars here."""
    trackers: Annotated[list[TrackerConfig], Field(max_length=3, json_schema_extra=TRACKER_LIST_SCHEMA)] = []
    """Experiment trackers rank 0 logs to (MLflow, Weights & Biases, SwanLab): the metrics endpoint's series, the
    resolved config, system info and evaluation results; a restarted job continues the same tracker run."""

    @model_validator(mode="after")
    def _one_run_per_tracker(self) -> "ObservabilityConfig":
        check_trackers(self.trackers)
        return self


class NumericsConfig(EngineModel):
    """Numerics-aware recovery: a step whose loss or gradient norm is NaN or Inf, or whose loss spikes over the
    recent median, rolls the run back in-process to its latest checkpoint and skips that step's global batch
    (the consumed-samples counter moves past it; the skip is kept in later checkpoints), at most maxRollbacks
    times; then the run fails with reason NumericFault naming the iteration and the samples."""

    maxRollbacks: Annotated[int, Field(ge=0), Flag("--numerics-max-rollbacks")] = 3
    """Rollbacks allowed over the whole run (restarts included: the count is kept in the checkpoint); the next
    numeric fault fails the run. 0 fails at the first one."""
    lossSpikeFactor: Annotated[float, Field(ge=0), not_null("0 to disable"),
                               Flag("--numerics-loss-spike-factor")] = 3.0
    """A step whose loss is over this factor times the median loss of the previous lossSpikeWindow steps, and at
    least 1.0 over that median, is a numeric fault (stages pretrain and sft: the other objectives' losses sit near
    or below zero). 0 disables spike detection; NaN and Inf are always checked. Without a checkpoint to roll back
    to, a spike is reported and training goes on."""
    lossSpikeWindow: Annotated[PositiveInt, Flag("--numerics-loss-spike-window")] = 20
    """Steps whose median loss a spike is measured against (the previous ones, up to this many); the check starts
    after 5 steps, or this many if fewer (the losses are kept in the checkpoint, so a resumed run checks at once)."""

    @model_validator(mode="after")
    def _factor(self) -> "NumericsConfig":
        if 0 < self.lossSpikeFactor <= 1:
            raise ValueError(f"lossSpikeFactor ({self.lossSpikeFactor}) must be over 1 (a multiple of the median "
                             "loss), or 0 to disable spike detection")
        return self


MOE_TP_NEEDS_SEQUENCE_PARALLEL = (
    # Said by TrainConfig and by the AscendTrainJob CRD's CEL rule, so kubectl apply and the engine agree.
    "model.numExperts (MoE) with parallel.tensorModelParallelSize > 1 needs parallel.sequenceParallel: "
    "megatron-core's MoE layers refuse to train under tensor parallelism without it")


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
    numerics: NumericsConfig = NumericsConfig()
    """Numerics-aware recovery: roll back and skip the data window of a NaN / Inf or spiking step."""

    @model_validator(mode="after")
    def _consistent(self) -> "TrainConfig":
        m, p, t = self.model, self.parallel, self.training
        tp = p.tensorModelParallelSize
        broken = first_broken(self)  # shapes and megatron-core's refusals (the CRD's CEL rules say the same)
        if broken:
            raise ValueError(broken)
        ep = p.expertModelParallelSize
        if ep > 1 and m.numExperts is None:
            raise ValueError(f"parallel.expertModelParallelSize ({ep}) needs model.numExperts (an MoE model)")
        if m.numExperts is not None:
            if m.numExperts % ep:
                raise ValueError(f"parallel.expertModelParallelSize ({ep}) must divide model.numExperts "
                                 f"({m.numExperts})")
            if tp > 1 and not p.sequenceParallel:
                raise ValueError(MOE_TP_NEEDS_SEQUENCE_PARALLEL)
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
