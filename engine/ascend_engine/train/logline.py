"""The per-interval log line, in Megatron-LM's format so existing log parsers and habits keep working."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepStats:
    iteration: int
    train_iters: int
    consumed_samples: int
    ms_per_iter: float
    learning_rate: float
    global_batch_size: int
    loss: float
    grad_norm: float | None
    tokens_per_second: float
    tflops_per_device: float
    mfu: float
    loss_scale: float | None = None
    skipped: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    """The stage's other metrics (rewards/chosen, ...), printed after the loss."""


def format_line(s: StepStats) -> str:
    parts = [
        f" iteration {s.iteration:8d}/{s.train_iters:8d}",
        f"consumed samples: {s.consumed_samples:12d}",
        f"elapsed time per iteration (ms): {s.ms_per_iter:.1f}",
        f"learning rate: {s.learning_rate:.6E}",
        f"global batch size: {s.global_batch_size:5d}",
        f"lm loss: {s.loss:.6E}",
        *(f"{name}: {value:.6E}" for name, value in s.extra.items()),
    ]
    if s.loss_scale is not None:
        parts.append(f"loss scale: {s.loss_scale:.1f}")
    if s.grad_norm is not None:
        parts.append(f"grad norm: {s.grad_norm:.3f}")
    parts += [f"tokens/s: {s.tokens_per_second:.1f}", f"TFLOP/s/device: {s.tflops_per_device:.3f}",
              f"MFU: {100 * s.mfu:.2f}%"]
    if s.skipped:
        parts.append(f"number of skipped iterations: {s.skipped:3d}")
    return " | ".join(parts) + " |"


def flops_per_step(num_layers: int, hidden: int, ffn_hidden: int, heads: int, head_dim: int, query_groups: int,
                   vocab: int, seq: int, global_batch: int, swiglu: bool) -> float:
    """Model FLOPs of one step (forward + backward = 3x forward), as Megatron-LM's throughput estimate counts.

    Per token and layer: QKV and output projections, attention scores and values (2 x seq x heads x
    head_dim multiply-adds each), the MLP; plus the output layer.
    """
    q = heads * head_dim
    kv = 2 * query_groups * head_dim
    attn_proj = hidden * (q + kv) + q * hidden
    attn_scores = 2 * seq * q
    mlp = hidden * ffn_hidden * (3 if swiglu else 2)
    per_token_fwd = 2 * (num_layers * (attn_proj + attn_scores + mlp) + hidden * vocab)
    return 3.0 * per_token_fwd * seq * global_batch
