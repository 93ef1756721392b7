"""AscendTrainJob: N indexed pods x M devices running ``torchrun -m ascend_engine train`` (then ``evaluate``
with an evaluation block, or only ``evaluate`` on an existing checkpoint without train), or the user's own
trainer command (``trainer``) in their image."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from ascend_engine.config.evaluate import EvaluateConfig
from ascend_engine.config.shape_rules import SHAPE_RULES, SPEC_RULES
from ascend_engine.config.train import MOE_TP_NEEDS_SEQUENCE_PARALLEL, TrainConfig

from .devices import HcclSettings, TrainDeviceSettings
from .elastic import ELASTIC_RULES, ElasticPolicy, ElasticStatus
from .evaluation import EvaluationStatus
from .kube import IMAGE_RULE, JobStatusBase, KubeModel, ObjectName, PodSettings
from .recovery import Goodput, Recovery
from .topology import TOPOLOGY_RULES, PlacementStatus, TopologySpec
from .run_policy import TrainRunPolicy
from .tracking import TrackedRun
from .trainer import TrainerCommand

WORLD_SIZE_RULE = {
    # The same check as TrainConfig.check_world_size, for the API server (CEL) so `kubectl apply` fails early.
    # Expert layers use TP x PP x EP ranks (EP is 1 for dense models), which implies TP x PP.
    "rule": "!has(self.train) || (self.nnodes * self.nprocPerNode) % (self.train.parallel.tensorModelParallelSize"
            " * self.train.parallel.pipelineModelParallelSize * self.train.parallel.expertModelParallelSize) == 0",
    "message": "nnodes x nprocPerNode must be divisible by train.parallel.tensorModelParallelSize x "
               "train.parallel.pipelineModelParallelSize x train.parallel.expertModelParallelSize",
    "fieldPath": ".nnodes",
    "reason": "FieldValueInvalid",
}
# TrainConfig.check_world_size's batch check, for the API server: without it a job was accepted and then failed
# InvalidSpec when the operator parsed it. Vacuous when WORLD_SIZE_RULE already fails (no division by zero).
_TP_PP = "(self.train.parallel.tensorModelParallelSize * self.train.parallel.pipelineModelParallelSize)"
_DP = f"((self.nnodes * self.nprocPerNode) / {_TP_PP})"
GLOBAL_BATCH_RULE = {
    "rule": f"!has(self.train) || (self.nnodes * self.nprocPerNode) % {_TP_PP} != 0"
            f" || self.train.training.globalBatchSize % (self.train.training.microBatchSize * {_DP}) == 0",
    "message": "train.training.globalBatchSize must be a multiple of microBatchSize x data-parallel size (nnodes x "
               "nprocPerNode / (tensorModelParallelSize x pipelineModelParallelSize))",
    # format, not string(int) concatenated: kube-apiserver cannot bound the size of string(int), and refuses the CRD
    # for that concatenation's estimated cost (admission.RESERVED_ENV_RULE says more).
    "messageExpression": "'train.training.globalBatchSize (%d) must be a multiple of microBatchSize x data-parallel"
                         " size = %d x %d (nnodes x nprocPerNode / (tensorModelParallelSize x pipelineModelParallel"
                         "Size))'.format([self.train.training.globalBatchSize, self.train.training.microBatchSize,"
                         f" {_DP}])",
    "fieldPath": ".train.training.globalBatchSize",
    "reason": "FieldValueInvalid",
}
EXPERT_RULES = [
    # TrainConfig's MoE check, for the API server: routed experts split evenly over EP ranks.
    {"rule": "!has(self.train) || (!has(self.train.model.numExperts) ? self.train.parallel.expertModelParallelSize"
             " == 1 : self.train.model.numExperts % self.train.parallel.expertModelParallelSize == 0)",
     "message": "train.parallel.expertModelParallelSize must divide train.model.numExperts (and be 1 without it)",
     "fieldPath": ".train.parallel.expertModelParallelSize", "reason": "FieldValueInvalid"},
    {"rule": "!has(self.train) || !has(self.train.model.numExperts)"
             " || self.train.parallel.tensorModelParallelSize == 1 || self.train.parallel.sequenceParallel",
     "message": MOE_TP_NEEDS_SEQUENCE_PARALLEL,
     "fieldPath": ".train.parallel.sequenceParallel", "reason": "FieldValueRequired"},
]
# The layout's shape (TP dividing heads, query groups and MLP widths, PP and VPP dividing the layers, the batch and
# the vocabulary), from the table TrainConfig checks too: without them a job was accepted and then failed InvalidSpec.
SHAPE_CEL_RULES = [rule.crd_rule() for rule in (*SHAPE_RULES, *SPEC_RULES)]
# Cross-field rules the API server checks on apply; the model validator below says the same for the operator.
PIPELINE_RULES = [
    {"rule": "!has(self.datasetPrepRef) || !has(self.train) || !has(self.train.data)"
             " || !has(self.train.data.dataPath) || size(self.train.data.dataPath) == 0",
     "message": "datasetPrepRef and train.data.dataPath exclude each other: the DatasetPrep's outputs become dataPath",
     "fieldPath": ".datasetPrepRef", "reason": "FieldValueForbidden"},
    {"rule": "!has(self.checkpointConvertRef) || !has(self.train) || !has(self.train.checkpoint)"
             " || !has(self.train.checkpoint.load)",
     "message": "checkpointConvertRef and train.checkpoint.load exclude each other: the converted checkpoint "
                "becomes checkpoint.load",
     "fieldPath": ".checkpointConvertRef", "reason": "FieldValueForbidden"},
    {"rule": "!has(self.volcanoQueue) || (has(self.gangScheduling) && self.gangScheduling == 'volcano')",
     "message": "volcanoQueue needs gangScheduling: volcano",
     "fieldPath": ".volcanoQueue", "reason": "FieldValueForbidden"},
]
# Pod 0 serves the rendezvous (masterPort) and rank 0's metrics: one port for both fails at bind after the pods
# started. With hostNetwork the operator assigns both from the job's own block, so the written ones do not apply.
PORT_RULES = [
    {"rule": f"self.hostNetwork || !has(self.{block}) || self.{block}.{port} != self.masterPort",
     "message": f"{block}.{port} and masterPort must differ: pod 0 listens on both",
     "fieldPath": f".{block}.{port}", "reason": "FieldValueInvalid"}
    for block, port in (("train", "observability.metricsPort"), ("trainer", "metricsPort"))]
# An evaluation-only job (no train) evaluates an existing checkpoint; there is nothing to prepare or convert.
EVALUATION_ONLY_RULES = [
    {"rule": "has(self.train) || has(self.trainer) || has(self.evaluation)",
     "message": "set train, evaluation or both, or trainer: a job with none has nothing to run",
     "fieldPath": ".train", "reason": "FieldValueRequired"},
    {"rule": "has(self.train) || has(self.trainer) || !has(self.evaluation) || has(self.evaluation.load)",
     "message": "evaluation.load is required without train: there is no checkpoint.save to evaluate",
     "fieldPath": ".evaluation.load", "reason": "FieldValueRequired"},
    {"rule": "has(self.train) || has(self.trainer) || (!has(self.datasetPrepRef) && !has(self.checkpointConvertRef))",
     "message": "datasetPrepRef and checkpointConvertRef feed training: they need train (evaluation.load reads "
                "a HuggingFace or Megatron checkpoint directly)",
     "fieldPath": ".train", "reason": "FieldValueRequired"},
]

# EvaluateConfig's own check (its model validator says the same), kept by the API server too.
EVALUATION_TOKENIZER_RULE = {
    "rule": "!has(self.evaluation) || has(self.evaluation.tokenizerNameOrPath) || has(self.evaluation.completions)",
    "message": "evaluation.tokenizerNameOrPath is required to generate answers (only scoring supplied completions "
               "goes without)",
    "fieldPath": ".evaluation.tokenizerNameOrPath", "reason": "FieldValueRequired"}
# A job runs the engine (train) or the user's own command (trainer), never both; the engine-only blocks stay with
# the engine.
TRAINER_RULES = [
    {"rule": "!has(self.trainer) || !has(self.train)",
     "message": "train and trainer exclude each other: train runs the engine, trainer runs your own command",
     "fieldPath": ".trainer", "reason": "FieldValueForbidden"},
    {"rule": "!has(self.trainer) || (!has(self.evaluation) && !has(self.datasetPrepRef)"
             " && !has(self.checkpointConvertRef))",
     "message": "evaluation, datasetPrepRef and checkpointConvertRef feed the engine's train: with trainer, point "
                "your command at the data and checkpoint itself",
     "fieldPath": ".trainer", "reason": "FieldValueForbidden"},
]


class AscendTrainJobSpec(PodSettings):
    """A distributed training job: the pods (Kubernetes part) and the engine's TrainConfig (`train`)."""

    model_config = PodSettings.model_config | {
        "json_schema_extra": {"x-kubernetes-validations": [WORLD_SIZE_RULE, GLOBAL_BATCH_RULE, *EXPERT_RULES, *SHAPE_CEL_RULES,
                                                              *PIPELINE_RULES,
                                                              *EVALUATION_ONLY_RULES, EVALUATION_TOKENIZER_RULE,
                                                              *TRAINER_RULES, *ELASTIC_RULES, *PORT_RULES,
                                                              *TOPOLOGY_RULES, IMAGE_RULE]}}

    nnodes: Annotated[int, Field(ge=1, le=4096)] = 1
    """Number of pods (torchrun nodes); pod i is NODE_RANK i (with topology, ranks follow the placement)."""
    nprocPerNode: Annotated[int, Field(ge=1, le=64)] = 1
    """Processes per pod; each gets one device of `devices.resource`."""
    devices: TrainDeviceSettings = TrainDeviceSettings()
    """Accelerator requested per pod."""
    hccl: HcclSettings = HcclSettings()
    """HCCL settings for Ascend pods."""
    masterPort: Annotated[int, Field(ge=1024, le=65535)] = 29500
    """MASTER_PORT of the torchrun rendezvous on pod 0 (with hostNetwork the operator assigns one instead)."""
    masterWaitSeconds: Annotated[int, Field(ge=1, le=86400)] = 600
    """How long pods 1..N-1 wait for pod 0's address and port before torchrun starts; when it runs out the
    job fails with reason MasterUnreachable instead of torchrun failing on a name that does not resolve yet."""
    hostNetwork: bool = False
    """Run the pods in the node's network namespace (RoCE/HCCN setups). MASTER_PORT, the metrics port and
    HCCL_IF_BASE_PORT then come from a block of ports the operator assigns to this job alone
    (status.hostPorts), so jobs sharing a node never clash."""
    gangScheduling: Literal["kubernetes", "volcano", "coscheduling"] | None = None
    """Gang scheduling: all nnodes pods are placed together or not at all. kubernetes: kube-scheduler's own
    (Kubernetes 1.36+, feature gate GenericWorkload): one PodGroup per attempt (scheduling.k8s.io, the newest of
    v1alpha3 / v1alpha2 the cluster serves) named <job>-<attempt>, policy gang with minCount = nnodes, its topology
    constraint topology.required, each pod's schedulingGroup naming it; tested against the real kube-scheduler.
    volcano creates a Volcano PodGroup (scheduling.volcano.sh/v1beta1, minMember = nnodes) and sets schedulerName
    volcano unless given; coscheduling creates a scheduler-plugins PodGroup (scheduling.x-k8s.io/v1alpha1) and
    labels the pods: those two are rendered as their schedulers document but never run against them here."""
    volcanoQueue: ObjectName | None = None
    """Volcano queue of the PodGroup (gangScheduling volcano)."""
    topology: TopologySpec | None = None
    """Where the gang may be placed (one block or rack, tensor-parallel groups in one server) and NODE_RANK ordered
    by where the pods landed: the order is in status.placement and each pod's environment. Without it NODE_RANK is
    the pod's index."""
    runPolicy: TrainRunPolicy = TrainRunPolicy()
    """Restarts, deadline, clean-up, TTL and suspension."""
    elastic: ElasticPolicy | None = None
    """Elastic data parallelism: when pods cannot be scheduled after a fault, continue from the last checkpoint on
    fewer pods (down to elastic.minNodes) with the same global batch, and scale back out to nnodes at the next
    checkpoint once capacity returns."""
    datasetPrepRef: ObjectName | None = None
    """Name of a DatasetPrep in the same namespace: the job stays Pending until it has succeeded, then trains
    on its outputs (they become train.data.dataPath)."""
    checkpointConvertRef: ObjectName | None = None
    """Name of a CheckpointConvert (hf -> mg) in the same namespace: the job stays Pending until it has
    succeeded, then fine-tunes from its output (train.checkpoint.load, finetune); after a gang restart it
    resumes from its own checkpoint.save instead."""
    train: TrainConfig | None = None
    """The engine's training configuration (Megatron / MindSpeed-LLM names). When checkpoint.save is set and
    checkpoint.load is not, the operator renders load = save, so a restarted or resumed job continues from
    its latest checkpoint by itself. Leave it out (with `evaluation` and its load) to only evaluate."""
    trainer: TrainerCommand | None = None
    """Your own trainer instead of the engine (exclusive with train): a command run in every pod of spec.image,
    e.g. Megatron-LM's or MindSpeed-LLM's torchrun line (`ascend-engine import-script --keep-as-is` writes it from
    a launch script). The pods get the same torchrun and HCCL environment, devices, gang scheduling and restarts
    as the engine's; live progress comes from its log lines (trainer.progress)."""
    evaluation: EvaluateConfig | None = None
    """Benchmarks to run after training, on the same pods and layout (`ascend-engine evaluate`, MindSpeed-LLM's
    evaluation flags); load defaults to train.checkpoint.save. Without train the pods only evaluate
    evaluation.load. Results land in status.evaluation; a failed evaluation fails the job with its cause in the
    condition message."""

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nprocPerNode

    @model_validator(mode="after")
    def _world_size(self) -> "AscendTrainJobSpec":
        broken = (bool(self.trainer and self.train),
                  bool(self.trainer and (self.evaluation or self.datasetPrepRef or self.checkpointConvertRef)))
        for rule, bad in zip(TRAINER_RULES, broken):
            if bad:
                raise ValueError(rule["message"])
        if self.trainer is not None:
            pass  # the user's command: nothing of the engine's to check
        elif self.train is None:
            only = EVALUATION_ONLY_RULES
            broken = (self.evaluation is None, self.evaluation is not None and not self.evaluation.load,
                      bool(self.datasetPrepRef or self.checkpointConvertRef))
            for rule, bad in zip(only, broken):
                if bad:
                    raise ValueError(rule["message"])
        else:
            try:
                self.train.check_world_size(self.world_size)
            except ValueError as e:
                raise ValueError(f"nnodes x nprocPerNode ({self.nnodes} x {self.nprocPerNode}): {e}") from None
        ports = (self.train and self.train.observability.metricsPort, self.trainer and self.trainer.metricsPort)
        for rule, port in zip(PORT_RULES, ports):
            if not self.hostNetwork and port == self.masterPort:
                raise ValueError(rule["message"])
        if self.elastic is not None:
            self._check_elastic(self.elastic)
        if self.topology is not None and self.topology.tensorParallel:
            self._check_tensor_parallel_topology()
        broken = (bool(self.datasetPrepRef and self.train and self.train.data.dataPath),
                  bool(self.checkpointConvertRef and self.train and self.train.checkpoint.load),
                  bool(self.volcanoQueue and self.gangScheduling != "volcano"))
        for rule, bad in zip(PIPELINE_RULES, broken):
            if bad:
                raise ValueError(rule["message"])
        return self

    def _check_tensor_parallel_topology(self) -> None:
        needs_train, whole_pods = TOPOLOGY_RULES[4:6]
        if self.train is None:
            raise ValueError(needs_train["message"])
        tp = self.train.parallel.tensorModelParallelSize
        if tp > self.nprocPerNode and tp % self.nprocPerNode:
            raise ValueError(f"{whole_pods['message']} ({tp} and {self.nprocPerNode})")

    def tensor_parallel_pods(self) -> int:
        """Pods a tensor-parallel group spans (1 when a group fits in one pod, or without train)."""
        tp = self.train.parallel.tensorModelParallelSize if self.train else 1
        return tp // self.nprocPerNode if tp > self.nprocPerNode else 1

    def _check_elastic(self, elastic: ElasticPolicy) -> None:
        needs_train, at_most, needs_save = ELASTIC_RULES[:3]
        if self.train is None:
            raise ValueError(needs_train["message"])
        if elastic.minNodes > self.nnodes:
            raise ValueError(f"elastic.minNodes ({elastic.minNodes}) must be at most nnodes ({self.nnodes}): "
                             "nnodes is the desired and largest size")
        if not self.train.checkpoint.save:
            raise ValueError(needs_save["message"])
        try:
            self.train.check_world_size(elastic.minNodes * self.nprocPerNode)
        except ValueError as e:
            raise ValueError(f"elastic.minNodes x nprocPerNode ({elastic.minNodes} x {self.nprocPerNode}): {e}") from None

    def elastic_sizes(self) -> list[int]:
        """Pod counts the job may run at, largest first: nnodes down to elastic.minNodes, those whose world size
        TP x PP (x EP) and the global batch allow (just nnodes without elastic)."""
        low = self.elastic.minNodes if self.elastic else self.nnodes
        sizes = []
        for nodes in range(self.nnodes, low - 1, -1):
            try:
                if self.train is not None:
                    self.train.check_world_size(nodes * self.nprocPerNode)
            except ValueError:
                continue
            sizes.append(nodes)
        return sizes


class ProgressColumns(KubeModel):
    """The figures as `kubectl get atj` shows them; the raw numbers stay next to them in `progress`."""

    loss: str | None = None
    """progress.loss to 4 significant digits."""
    tokensPerSecond: str | None = None
    """progress.tokensPerSecond rounded to a whole number."""

    @classmethod
    def of(cls, progress: dict[str, Any]) -> dict[str, str]:
        """The columns of a ``status.progress`` dict (only those whose figure is known)."""
        loss, rate = progress.get("loss"), progress.get("tokensPerSecond")
        columns = cls(loss=None if loss is None else f"{loss:#.4g}",
                      tokensPerSecond=None if rate is None else str(round(rate)))
        return columns.model_dump(exclude_none=True)


class TrainProgress(KubeModel):
    """Live figures from rank 0's metrics endpoint."""

    @staticmethod
    def with_columns(progress: dict[str, Any]) -> dict[str, Any]:
        """``progress`` with its printer-column strings (``columns``) brought up to date."""
        columns = ProgressColumns.of(progress)
        return {**{k: v for k, v in progress.items() if k != "columns"}, **({"columns": columns} if columns else {})}

    columns: ProgressColumns | None = None
    """The loss and throughput as `kubectl get` prints them."""

    iteration: int | None = None
    """Optimizer steps done."""
    trainIters: int | None = None
    """Steps to run."""
    percent: float | None = None
    """iteration / trainIters x 100."""
    loss: float | None = None
    """Latest LM loss."""
    validationLoss: float | None = None
    """Latest validation LM loss (training.evalInterval)."""
    loadBalancingLoss: float | None = None
    """MoE models: latest router load-balancing loss (before its coefficient)."""
    learningRate: float | None = None
    """Current learning rate."""
    tokensPerSecond: float | None = None
    """Throughput over all ranks."""
    mfu: float | None = None
    """Model FLOPs utilisation (0-1)."""
    etaSeconds: float | None = None
    """Estimated seconds to finish."""
    lastCheckpointIteration: int | None = None
    """Iteration of the newest saved checkpoint."""
    savingCheckpoint: bool | None = None
    """Rank 0 is writing a checkpoint (stall detection then allows runPolicy.stallDetection.checkpointSeconds)."""
    numericRollbacks: int | None = None
    """Numeric faults (NaN / Inf loss or grad norm, loss spikes) the engine has rolled back from (train.numerics);
    each is a Warning event NumericRollback naming the iteration and the skipped samples."""
    skippedSamples: int | None = None
    """Training samples skipped after numeric faults (the faulting steps' global batches)."""
    skippedWindowIteration: int | None = None
    """The newest skipped window: the iteration whose step faulted."""
    skippedWindowFirstSample: int | None = None
    """The newest skipped window's first sample (of the run's sample order)."""
    skippedWindowEndSample: int | None = None
    """One past the newest skipped window's last sample."""
    rewardsChosen: float | None = None
    """dpo / simpo / orm: mean reward of the chosen replies."""
    rewardsRejected: float | None = None
    """dpo / simpo / orm: mean reward of the rejected replies."""
    rewardMargin: float | None = None
    """dpo / simpo / orm: mean of chosen minus rejected reward."""
    rewardAccuracy: float | None = None
    """dpo / simpo / orm: fraction of pairs whose chosen reply out-rewards the rejected one."""
    stepAccuracy: float | None = None
    """prm: fraction of reasoning steps whose label's reward token has the largest logit among the reward tokens."""
    rewardMean: float | None = None
    """grpo: mean reward of the step's responses."""
    rewardStd: float | None = None
    """grpo: standard deviation of the step's rewards."""
    accuracy: float | None = None
    """grpo: fraction of responses the first verifier function scores above 0."""
    rewardModelScore: float | None = None
    """grpo with grpo.rewardModel: mean score of the step's responses by the reward model (before its weight)."""
    responseLength: float | None = None
    """grpo: mean response length in tokens."""
    kl: float | None = None
    """grpo: mean k3 KL of the policy to the frozen reference (klCoef > 0)."""
    clipFraction: float | None = None
    """grpo: fraction of response tokens whose probability ratio was clipped."""
    entropy: float | None = None
    """grpo: mean token entropy of the policy over the responses."""
    rolloutSeconds: float | None = None
    """grpo: seconds of the step spent generating and scoring."""
    updateSeconds: float | None = None
    """grpo: seconds of the step spent on reference log-probs and policy updates."""
    rolloutTokensPerSecond: float | None = None
    """grpo: generated tokens per second over all ranks."""
    updateTokensPerSecond: float | None = None
    """grpo: trained (prompt + response) tokens per second over all ranks, all policy updates counted."""
    lastUpdateTime: str | None = None
    """When these figures were read (RFC 3339)."""


class HostPorts(KubeModel):
    """The block of node ports a hostNetwork job owns."""

    block: int
    """Index of the block within the operator's host port range."""
    masterPort: int
    """MASTER_PORT."""
    metricsPort: int
    """Rank 0's metrics port."""
    hcclIfBasePort: int
    """HCCL_IF_BASE_PORT (HCCL uses ports from here up)."""


class PlanStage(KubeModel):
    """One pipeline stage's estimate per device, in GiB."""

    stage: int
    """Pipeline stage index."""
    totalGiB: float
    """Everything below plus the fixed framework overhead."""
    paramsGiB: float
    """Model weights held by one device of the stage."""
    gradsGiB: float
    """Main gradients (fp32)."""
    optimizerGiB: float
    """Optimizer state (fp32 master weights and moments; divided by DP with the distributed optimizer)."""
    activationsGiB: float
    """Activations of the micro-batches in flight under 1F1B."""


class PlanStatus(KubeModel):
    """The memory plan the operator checked before creating the pods (docs/plan.md)."""

    largestStage: int
    """The pipeline stage with the largest per-device estimate."""
    peakBytes: int
    """Its estimate per device, in bytes."""
    peakGiB: float
    """The same in GiB."""
    verdict: Literal["fits", "near", "exceeds", "unknown"]
    """fits; near (over 90% of the device's memory: warned); exceeds (refused); unknown (no device memory)."""
    device: str | None = None
    """The device the estimate was held against (Ascend 910B, a GPU product), absent for CPU pods."""
    deviceBytes: int | None = None
    """Memory of one device in bytes."""
    deviceGiB: float | None = None
    """The same in GiB."""
    stages: list[PlanStage] = []
    """Every stage's estimate."""


class AscendTrainJobStatus(JobStatusBase):
    """Observed state of an AscendTrainJob."""

    progress: TrainProgress | None = None
    """Training progress from rank 0."""
    evaluation: EvaluationStatus | None = None
    """Benchmark results of spec.evaluation."""
    hostPorts: HostPorts | None = None
    """Ports assigned to a hostNetwork job."""
    elastic: ElasticStatus | None = None
    """Desired and current size of an elastic job."""
    recoveries: list[Recovery] = []
    """The newest recoveries (at most 20), oldest first: the ladder's level that handled each and what it cost."""
    goodput: Goodput | None = None
    """Productive training time against wall time, and where the rest went."""
    plan: PlanStatus | None = None
    """The per-device memory estimate checked when the operator admitted the job."""
    tracking: list[TrackedRun] = []
    """Where the experiment trackers (train.observability.trackers) keep this job's run: one entry per tracker."""
    placement: PlacementStatus | None = None
    """With spec.topology: where the current attempt's pods landed and the NODE_RANK order that follows."""
