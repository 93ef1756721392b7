"""MindSpeed-LLM / Megatron-LM switches that make a run faster or leaner without changing what it computes.

The engine picks its kernels, fusions and overlaps for the device it runs on (``device.py``), so these flags have
no effect here: ``import-script`` names them apart from the flags it could not carry over (which would change
the run), and ``--strict`` does not count them. A flag that changes the numbers (``--attention-softmax-in-fp32``,
``--initial-loss-scale``) or the model stays a flag not imported.
"""
from __future__ import annotations

NO_EFFECT_REASON = "acceleration switches: the engine chooses its own kernels, fusions and overlaps"

ACCELERATION_FLAGS = frozenset({
    # fused kernels (MindSpeed's NPU operators, Apex / Transformer Engine fusions)
    "--use-flash-attn", "--use-fused-rmsnorm", "--use-fused-swiglu", "--use-fused-rotary-pos-emb",
    "--use-fused-ring-attention-update", "--use-fused-moe-token-permute-and-unpermute", "--lora-fusion",
    "--gradient-accumulation-fusion", "--no-gradient-accumulation-fusion",
    "--masked-softmax-fusion", "--no-masked-softmax-fusion", "--bias-gelu-fusion", "--no-bias-gelu-fusion",
    "--bias-dropout-fusion", "--no-bias-dropout-fusion", "--no-bias-swiglu-fusion", "--no-rope-fusion",
    "--cross-entropy-loss-fusion", "--transformer-impl", "--jit-compile",
    # communication overlap and Ascend's matmul-communication fusion (MC2, CoC)
    "--use-mc2", "--use-ascend-mc2", "--use-ascend-coc", "--coc-parallel-num", "--coc-mode",
    "--overlap-grad-reduce", "--overlap-param-gather", "--use-cp-send-recv-overlap",
    "--moe-permutation-async-comm", "--moe-alltoall-overlap-comm", "--async-log-allreduce",
    # memory-for-speed trades that leave the results alone
    "--swap-attention", "--reuse-fp32-param", "--use-nanopipe", "--manual-gc", "--manual-gc-interval",
    # always so here: megatron-core models, the device's collective backend, throughput in every step line
    "--use-mcore-models", "--distributed-backend", "--log-throughput",
})


def has_no_effect(flag: str) -> bool:
    return flag in ACCELERATION_FLAGS
