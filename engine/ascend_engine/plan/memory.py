"""A per-device memory estimate for a training layout, per pipeline stage, before anything is allocated.

Pure arithmetic on the config (no torch): what Megatron-core keeps on one device of stage ``p``

* parameters: the stage's transformer layers, the word embedding on the first stage, the final norm and the
  output layer on the last (with tied embeddings and PP > 1 the last stage holds its own copy of the embedding,
  as Megatron does), tensor-parallel weights split by TP, routed experts split by EP (and by TP, Megatron's
  default expert tensor parallel size), norms and routers whole;
* gradients: the DDP buffer of main gradients, fp32 whatever the precision (the engine sets
  ``grad_reduce_in_fp32``, as Megatron-LM does for bf16), for the trainable parameters only (LoRA: adapters);
* optimizer state: Adam's two moments (SGD's momentum) in fp32, plus an fp32 master copy of bf16/fp16 weights;
  divided by the data-parallel size with ``useDistributedOptimizer`` (the expert-data-parallel size for experts).
  Per parameter that is Megatron's published 18 bytes (bf16) / 16 (fp32) without it and 6 + 12/DP / 8 + 8/DP
  with it;
* activations: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (2022),
  Table 2, per layer and micro-batch, written out per tensor so that GQA, SwiGLU, dropout off and the MoE layers
  count what they store: without recomputation, with selective recomputation (the attention core recomputed; a
  fused/flash attention stores no s x s scores either) and with full recomputation (each layer's input, plus one
  layer's activations while it is recomputed), split by TP where Megatron splits them and by TP everywhere with
  sequence parallelism; times the micro-batches a stage holds under 1F1B (PP - p, at most the micro-batches per
  step; the interleaved schedule's warm-up with VPP), plus the logits and the loss's fp32 copy on the last stage;
* the MoE share: each token's top-k experts' MLP activations and the dispatch buffers, on average (a router's
  imbalance is not known in advance);
* the largest weight's gradient as autograd hands it over, before it is added to the main gradient;
* a fixed framework overhead (``overhead_bytes``, stated by the caller: the runtime context, the collectives'
  buffers, the allocator's cache).

What it cannot know (docs/plan.md): fragmentation and the caching allocator's slack, HCCL/NCCL buffers beyond
the stated overhead, custom or fused kernels' workspaces, a router's imbalance, GRPO's rollout caches.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

GIB = 1024 ** 3
PARAM_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
GRAD_BYTES = 4  # main gradients in fp32 (DistributedDataParallelConfig(grad_reduce_in_fp32=True))
WARN_FRACTION = 0.9
"""A stage estimated above this share of the device's memory is warned about; above 1.0 it is refused."""


@dataclass(frozen=True)
class StageEstimate:
    """One device of pipeline stage ``stage``: bytes of each part and what they were computed from."""

    stage: int
    layers: int
    parameters: int
    """Parameters held by one device of the stage (its TP and EP share)."""
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    overhead_bytes: int
    micro_batches_in_flight: int

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes + \
            self.overhead_bytes


@dataclass(frozen=True)
class MemoryPlan:
    stages: list[StageEstimate]
    device: str | None = None
    """The device's name (``Ascend 910B``), None when unknown or CPU."""
    device_bytes: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def largest(self) -> StageEstimate:
        return max(self.stages, key=lambda s: (s.total_bytes, -s.stage))

    @property
    def fraction(self) -> float | None:
        return None if not self.device_bytes else self.largest.total_bytes / self.device_bytes

    @property
    def verdict(self) -> str:
        """``fits``, ``near`` (above WARN_FRACTION), ``exceeds`` or ``unknown`` (no device memory to compare)."""
        f = self.fraction
        return "unknown" if f is None else "exceeds" if f > 1 else "near" if f > WARN_FRACTION else "fits"

    def summary(self) -> str:
        big = self.largest
        head = (f"stage {big.stage} of {len(self.stages)} needs {gib(big.total_bytes)} GiB per device "
                f"(params {gib(big.params_bytes)}, grads {gib(big.grads_bytes)}, optimizer "
                f"{gib(big.optimizer_bytes)}, activations {gib(big.activations_bytes)} for "
                f"{big.micro_batches_in_flight} micro-batch(es) in flight, overhead {gib(big.overhead_bytes)})")
        if self.device_bytes is None:
            return f"{head}; device memory unknown ({self.device or 'CPU'}): not checked"
        return (f"{head} of {gib(self.device_bytes)} GiB on {self.device} "
                f"({100 * self.fraction:.0f}%, headroom {gib(self.device_bytes - big.total_bytes)} GiB)")

    def status(self) -> dict[str, Any]:
        """The job's ``status.plan`` block."""
        big = self.largest
        out: dict[str, Any] = {"largestStage": big.stage, "peakBytes": big.total_bytes,
                               "peakGiB": round(big.total_bytes / GIB, 2), "verdict": self.verdict,
                               "stages": [{"stage": s.stage, "totalGiB": round(s.total_bytes / GIB, 2),
                                           "paramsGiB": round(s.params_bytes / GIB, 2),
                                           "gradsGiB": round(s.grads_bytes / GIB, 2),
                                           "optimizerGiB": round(s.optimizer_bytes / GIB, 2),
                                           "activationsGiB": round(s.activations_bytes / GIB, 2)}
                                          for s in self.stages]}
        if self.device:
            out["device"] = self.device
        if self.device_bytes:
            out["deviceBytes"] = self.device_bytes
            out["deviceGiB"] = round(self.device_bytes / GIB, 2)
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"stages": [asdict(s) | {"total_bytes": s.total_bytes} for s in self.stages], "device": self.device,
                "device_bytes": self.device_bytes, "verdict": self.verdict, "notes": self.notes}


def gib(n: float) -> str:
    return f"{n / GIB:.2f}"


# -- parameters ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Shape:
    h: int
    q: int          # query width: heads x head dim
    kv: int         # key/value width: query groups x head dim
    f: int          # dense MLP width
    f1: int         # fc1's output width (2 f with SwiGLU)
    norm: int       # elements of one norm layer (h, 2h for LayerNorm)
    bias: bool
    mlp_mats: int   # 3 with SwiGLU, 2 without


def _shape(m: Any) -> _Shape:
    return _Shape(h=m.hiddenSize, q=m.numAttentionHeads * m.head_dim, kv=m.num_query_groups * m.head_dim,
                  f=m.ffn_hidden_size, f1=(2 if m.swiglu else 1) * m.ffn_hidden_size,
                  norm=(2 if m.normalization == "LayerNorm" else 1) * m.hiddenSize, bias=m.addBiasLinear,
                  mlp_mats=3 if m.swiglu else 2)


def _attention_params(m: Any, sh: _Shape, tp: int) -> int:
    n = (sh.h * (sh.q + 2 * sh.kv) + sh.q * sh.h) // tp + sh.norm
    if m.addQkvBias or sh.bias:
        n += (sh.q + 2 * sh.kv) // tp
    if sh.bias:
        n += sh.h
    if m.qkLayernorm:
        n += 2 * m.head_dim
    return n


def _mlp_params(width: int, sh: _Shape, tp: int) -> int:
    n = sh.mlp_mats * sh.h * width // tp
    if sh.bias:
        n += (width * (sh.mlp_mats - 1)) // tp + sh.h
    return n


def _layer_params(m: Any, layer: int, tp: int, ep: int) -> tuple[int, int]:
    """(dense parameters, expert parameters) of global layer ``layer`` on one device."""
    sh = _shape(m)
    dense = _attention_params(m, sh, tp) + sh.norm  # + the pre-MLP norm
    if not m.is_moe_layer(layer):
        return dense + _mlp_params(sh.f, sh, tp), 0
    dense += sh.h * m.numExperts  # the router, whole on every rank
    if m.moeSharedExpertIntermediateSize:
        dense += _mlp_params(m.moeSharedExpertIntermediateSize, sh, tp) + (sh.h if m.moeSharedExpertGate else 0)
    return dense, (m.numExperts // ep) * _mlp_params(m.moe_ffn_hidden_size, sh, tp)


def stage_layers(num_layers: int, pp: int, vpp: int | None, stage: int) -> list[int]:
    """Global indices of the layers stage ``stage`` holds (chunk c of rank p is virtual stage c x PP + p)."""
    chunks = vpp or 1
    per_chunk = num_layers // (pp * chunks)
    return [(c * pp + stage) * per_chunk + i for c in range(chunks) for i in range(per_chunk)]


def _lora_params(cfg: Any, layers: int, tp: int) -> int:
    m, r = cfg.model, cfg.lora.loraR
    sh = _shape(m)
    sizes = {"linear_qkv": (sh.h, sh.q + 2 * sh.kv), "linear_proj": (sh.q, sh.h), "linear_fc1": (sh.h, sh.f1),
             "linear_fc2": (sh.f, sh.h)}
    return layers * sum(r * (i + o) // tp for i, o in (sizes[t] for t in cfg.lora.loraTargetModules))


# -- activations --------------------------------------------------------------------------------------------------

def _layer_activation_bytes(cfg: Any, moe: bool, tp: int, ep: int, recompute: str | None,
                            backend: str = "npu") -> float:
    """Bytes one layer stores for one micro-batch on one device (Korthikanti et al. Table 2, per tensor)."""
    m, t = cfg.model, cfg.training
    sh = _shape(m)
    e = PARAM_BYTES[t.precision]
    sp = cfg.parallel.sequenceParallel
    s, b = t.seqLength, t.microBatchSize * (2 if cfg.pairwise_data else 1)
    sb = s * b
    # Replicated over TP unless sequence parallel: the two norms' inputs, the QKV and fc1 inputs, dropout masks.
    masks = (1 if m.hiddenDropout > 0 else 0) * 2 * sb * sh.h
    # torch's own norms (the CPU path) also keep the normalised input for the weight's gradient; fused ones
    # (TE, apex, MindSpeed's) only the input and its inverse RMS
    unfused_norms = 2 if backend == "cpu" else 0
    whole = e * sb * sh.h * (4 + unfused_norms) + masks
    # Split by TP: Q, K, V; the attention output (linear_proj's input); fc1's output and fc2's input.
    attn = e * sb * (sh.q + 2 * sh.kv + sh.q)
    if moe:
        k = m.moeRouterTopk
        mlp = 4 * sb * m.numExperts * tp  # router logits and probabilities in fp32 (not split: undo the / tp)
        mlp += e * k * sb * sh.h * 2 * tp  # the permuted tokens in and out of the experts (whole rows)
        mlp += e * k * sb * m.moe_ffn_hidden_size * (4 if m.swiglu else 2)
        if m.moeSharedExpertIntermediateSize:
            mlp += e * sb * m.moeSharedExpertIntermediateSize * (4 if m.swiglu else 2)
    else:
        # fc1's output, fc2's input and, with SwiGLU unfused (the engine leaves bias_activation_fusion off), the
        # SiLU's output that the product keeps
        mlp = e * sb * (sh.f1 + sh.f + (sh.f if m.swiglu else 0))
    core = 0.0
    if recompute is None and not _fused_attention(cfg, backend):
        # The unfused attention core: softmax output (and dropout mask and output), heads split by TP.
        a = m.numAttentionHeads
        core = e * a * s * s * b * (1 + (1.5 if m.attentionDropout > 0 else 0))
    split = attn + mlp + core
    if recompute == "full":
        return e * sb * sh.h / (tp if sp else 1)
    return (whole / (tp if sp else 1)) + split / tp


def _fused_attention(cfg: Any, backend: str) -> bool:
    """Whether the attention core keeps no s x s scores. The engine's dense layers without sequence parallelism use
    its fused attention (SDPA, models/sdpa_attention.py) on every device; MoE or sequence-parallel layers use
    megatron-core's local attention, unfused unless MindSpeed replaces it with its flash attention (on NPU); attention
    dropout and packed-sample masks always take the unfused path."""
    if cfg.model.attentionDropout > 0 or cfg.data.neatPack:
        return False
    return (cfg.model.numExperts is None and not cfg.parallel.sequenceParallel) or backend == "npu"


def backend_of(cfg: Any, resource: str | None = None) -> str:
    """npu, cuda or cpu: the config's device, or (device auto) what the pods' device resource says."""
    if cfg.device != "auto":
        return cfg.device
    if resource is None:
        return "cpu"
    return "npu" if resource.startswith("huawei.com/") else "cuda"


def in_flight(pp: int, vpp: int | None, micro_batches: int, stage: int) -> float:
    """Layer-activation sets stage ``stage`` holds at its peak, in units of one micro-batch through all its layers
    (1F1B: PP - stage micro-batches; interleaved: Megatron's warm-up of (PP - stage - 1) x 2 + (VPP - 1) x PP chunk
    passes plus one, each a 1/VPP share of the stage's layers)."""
    if not vpp:
        return min(pp - stage, micro_batches)
    warmup = min((pp - stage - 1) * 2 + (vpp - 1) * pp, micro_batches * vpp)
    return (warmup + 1) / vpp


# -- the estimate -------------------------------------------------------------------------------------------------

def estimate(cfg: Any, world_size: int, *, device: str | None = None, device_bytes: int | None = None,
             overhead_bytes: int = 0, backend: str | None = None) -> MemoryPlan:
    """Per-device bytes of every pipeline stage of ``cfg`` (a TrainConfig) on ``world_size`` ranks; ``backend``
    (npu, cuda, cpu) defaults to the config's device (cpu for auto)."""
    backend = backend or backend_of(cfg)
    m, p, t = cfg.model, cfg.parallel, cfg.training
    tp, pp, ep = p.tensorModelParallelSize, p.pipelineModelParallelSize, p.expertModelParallelSize
    vpp = cfg.virtual_pipeline_size
    dp = max(1, world_size // (tp * pp))
    expert_dp = max(1, world_size // (tp * pp * ep))
    micro_batches = max(1, t.globalBatchSize // (t.microBatchSize * dp))
    pb = PARAM_BYTES[t.precision]
    master = 4 if pb < 4 else 0
    moments = 8 if cfg.optimizer.optimizer == "adam" else 4
    sh = _shape(m)
    vocab = m.padded_vocab_size(tp)
    notes = []
    reference = cfg.stage == "dpo" or (cfg.stage == "grpo" and cfg.grpo.klCoef > 0)
    if reference:
        notes.append(f"stage {cfg.stage}: a frozen reference model at the same layout counted as parameters")
    if cfg.stage == "grpo":
        notes.append("stage grpo: the rollouts' key/value caches are not counted")
    stages = []
    for stage in range(pp):
        layers = stage_layers(m.numLayers, pp, vpp, stage)
        dense = expert = 0
        for layer in layers:
            d, x = _layer_params(m, layer, tp, ep)
            dense, expert = dense + d, expert + x
        first, last = stage == 0, stage == pp - 1
        if first:
            dense += vocab * sh.h // tp + (m.maxPositionEmbeddings or t.seqLength) * sh.h * (
                m.positionEmbeddingType == "learned_absolute")
        if last:
            dense += sh.norm
            if m.scoreHead:
                dense += sh.h
            elif m.untieEmbeddingsAndOutputWeights or not first:
                dense += vocab * sh.h // tp  # the output layer, or the tied embedding's copy on the last stage
        held = dense + expert
        if cfg.lora.enabled:
            trainable_dense, trainable_expert = _lora_params(cfg, len(layers), tp), 0
            held += trainable_dense
        else:
            trainable_dense, trainable_expert = dense, expert
        params_bytes = pb * held * (2 if reference else 1)
        grads_bytes = GRAD_BYTES * (trainable_dense + trainable_expert)
        per_param = master + moments
        if p.useDistributedOptimizer:
            optimizer = per_param * (trainable_dense / dp + trainable_expert / expert_dp)
        else:
            optimizer = per_param * (trainable_dense + trainable_expert)
        per_micro = sum(_layer_activation_bytes(cfg, m.is_moe_layer(layer), tp, ep, t.recomputeGranularity, backend)
                        for layer in layers)
        if t.recomputeGranularity == "full" and layers:
            # one layer's activations while it is recomputed in the backward pass
            per_micro_extra = max(_layer_activation_bytes(cfg, m.is_moe_layer(layer), tp, ep, None, backend)
                                  for layer in layers)
        else:
            per_micro_extra = 0
        flight = in_flight(pp, vpp, micro_batches, stage)
        # The largest weight's gradient as autograd makes it, before DDP adds it to the main gradient and frees it
        # (megatron-core fuses the two only with gradient_accumulation_fusion, which the engine leaves off).
        biggest = max([vocab * sh.h // tp if first or last else 0, sh.f1 * sh.h // tp,
                       (m.numExperts // ep) * m.moe_ffn_hidden_size * sh.h // tp if m.numExperts else 0])
        activations = per_micro * flight + per_micro_extra + (pb * biggest if not cfg.lora.enabled else 0)
        b = t.microBatchSize * (2 if cfg.pairwise_data else 1)
        if first:
            activations += 8 * t.seqLength * b * flight  # the token ids
        if last and not m.scoreHead:
            # the logits, and the loss's fp32 copy of 16-bit ones (megatron-core's cross entropy works in place)
            activations += t.seqLength * b * vocab / tp * (pb + (4 if pb < 4 else 0))
        stages.append(StageEstimate(stage=stage, layers=len(layers), parameters=held,
                                    params_bytes=int(params_bytes), grads_bytes=int(grads_bytes),
                                    optimizer_bytes=int(optimizer), activations_bytes=int(activations),
                                    overhead_bytes=overhead_bytes,
                                    micro_batches_in_flight=max(1, round(flight))))
    return MemoryPlan(stages=stages, device=device, device_bytes=device_bytes, notes=notes)


def table(plan: MemoryPlan) -> str:
    """The per-stage table ``ascend-train plan`` prints (GiB)."""
    head = ("stage", "layers", "params", "grads", "optimizer", "activations", "overhead", "total", "device",
            "headroom")
    rows = []
    for s in plan.stages:
        dev = plan.device_bytes
        rows.append((str(s.stage), str(s.layers), gib(s.params_bytes), gib(s.grads_bytes), gib(s.optimizer_bytes),
                     gib(s.activations_bytes), gib(s.overhead_bytes), gib(s.total_bytes),
                     gib(dev) if dev else "-", gib(dev - s.total_bytes) if dev else "-"))
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in [head, *rows]]
    return "\n".join(lines)
