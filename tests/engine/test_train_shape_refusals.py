"""Layouts megatron-core refuses while it builds the model or in the first step, and that the spec now refuses
first (issue 49): each rule of ``ascend_engine/config/shape_rules.py`` added for one of megatron-core's asserts is
checked against megatron-core itself, so the rule is not a guess.

One torchrun of two processes on CPU (gloo) builds each layout with the engine's own model code
(``parallel.init_parallel``, ``models.gpt.build_gpt_model``) and runs one training forward and backward on a
micro-batch of ``seqLength`` tokens (the GRPO case: the rollout's generation on a 5-token prompt); the worker
reports what megatron-core raised. The test then requires, for each layout, megatron-core's error and
``TrainConfig``'s refusal naming the field with its figures (the same words kube-apiserver answers, see
tests/operator/test_manifests_on_the_server.py), and for the control layouts neither. Run as a script, this file
is the worker.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BASE = {"numLayers": 2, "hiddenSize": 64, "numAttentionHeads": 4, "vocabSize": 96}
MOE = {**BASE, "numExperts": 4, "moeFfnHiddenSize": 32}
SP2 = {"tensorModelParallelSize": 2, "sequenceParallel": True}
# name: (model, parallel, seqLength, what megatron-core raises (None: nothing), what TrainConfig says (None: valid))
CASES = {
    "sequence parallel, 63 tokens over TP 2": (
        BASE, SP2, 63, "First dimension of the tensor should be divisible by tensor parallel size",
        "training.seqLength (63) must be a multiple of parallel.tensorModelParallelSize (2) with sequenceParallel"),
    "sequence parallel, 64 tokens over TP 2": (BASE, SP2, 64, None, None),
    "grpo rollout under sequence parallelism": (
        BASE, SP2, 64, "First dimension of the tensor should be divisible by tensor parallel size",
        "stage grpo with parallel.sequenceParallel"),
    "learned positions shorter than the sequence": (
        {**BASE, "positionEmbeddingType": "learned_absolute", "maxPositionEmbeddings": 16}, {}, 32,
        "index out of range", "model.maxPositionEmbeddings (16) must be at least training.seqLength (32)"),
    "rope over an odd head dimension": (
        {**BASE, "hiddenSize": 60}, {}, 32, "must match the size of tensor b",
        "the head dimension (15 = model.hiddenSize / numAttentionHeads) must be even"),
    "learned positions over an odd head dimension": (
        {**BASE, "hiddenSize": 60, "positionEmbeddingType": "learned_absolute"}, {}, 32, None, None),
    "top-1 routing without pre-softmax": (
        {**MOE, "moeRouterTopk": 1}, {}, 32, "Please use --moe-router-pre-softmax when topk is 1",
        "model.moeRouterTopk 1 needs model.moeRouterPreSoftmax"),
    "sinkhorn routing with an auxiliary loss": (
        {**MOE, "moeRouterLoadBalancingType": "sinkhorn", "moeAuxLossCoeff": 0.01}, {}, 32,
        "Sinkhorn routing does not support aux loss", "model.moeAuxLossCoeff must be 0"),
    "experts with linear biases under TP 2": (
        {**MOE, "addBiasLinear": True}, SP2, 32, "Bias in Moe is only supported when ETP==1",
        "model.addBiasLinear with model.numExperts"),
    "shared expert width TP does not divide": (
        {**MOE, "moeSharedExpertIntermediateSize": 33}, SP2, 32, "33 is not divisible by 2",
        "parallel.tensorModelParallelSize (2) must divide model.moeSharedExpertIntermediateSize (33)"),
}


def _train_config(model: dict, parallel: dict, seq: int, name: str) -> dict:
    cfg = {"device": "cpu", "model": model, "parallel": parallel,
           "training": {"microBatchSize": 2, "globalBatchSize": 4 if parallel else 8, "seqLength": seq}}
    if "grpo" in name:
        cfg |= {"stage": "grpo", "data": {"dataPath": ["r1"], "tokenizerNameOrPath": "tok"},
                "grpo": {"maxNewTokens": 8, "verifierFunction": ["exact_match"]}}
    return cfg


@pytest.fixture(scope="module")
def raised() -> dict[str, str | None]:
    from test_train_torchrun import free_port

    cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), __file__]
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**env, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.engine
@pytest.mark.parametrize("name", CASES)
def test_megatron_core_refuses_what_the_spec_refuses(raised, name):
    from pydantic import ValidationError

    from ascend_engine.config.train import TrainConfig

    model, parallel, seq, megatron, ours = CASES[name]
    if megatron is None:
        assert raised[name] is None, raised[name]
    else:
        assert raised[name] is not None and megatron in raised[name], raised[name]
    if ours is None:
        TrainConfig.model_validate(_train_config(model, parallel, seq, name))
        return
    with pytest.raises(ValidationError) as refused:
        TrainConfig.model_validate(_train_config(model, parallel, seq, name))
    assert ours in str(refused.value), str(refused.value)


def _attempt(name: str) -> str | None:
    """Build ``CASES[name]`` at its TP (the rest of the two ranks data-parallel) and run one training forward and
    backward (the GRPO case: a generation); megatron-core's error as ``Type: message``, or None."""
    import torch
    from megatron.core import parallel_state

    from ascend_engine.config.model import ModelConfig
    from ascend_engine.config.train import ParallelConfig
    from ascend_engine.device import select_backend
    from ascend_engine.models.gpt import build_gpt_model
    from ascend_engine.parallel import init_parallel

    model_fields, parallel_fields, seq, _, _ = CASES[name]
    model, parallel = ModelConfig.model_validate(model_fields), ParallelConfig.model_validate(parallel_fields)
    init_parallel(select_backend("cpu"), parallel.tensorModelParallelSize, 1, seed=1)
    try:
        gpt = build_gpt_model(model, parallel, seq, seed=1)
        generator = torch.Generator().manual_seed(0)
        if "grpo" in name:
            from ascend_engine.generate.batched import generate_batch

            gpt.eval()
            generate_batch(gpt, [[1, 2, 3, 4, 5]], max_new_tokens=2, eos_id=None, vocab_size=model.vocabSize,
                           max_length=seq)
            return None
        tokens = torch.randint(0, model.vocabSize, (2, seq + 1), generator=generator)
        positions = torch.arange(seq).unsqueeze(0).expand(2, seq)
        gpt(tokens[:, :-1], positions, None, labels=tokens[:, 1:]).sum().backward()
        return None
    except Exception as error:  # what megatron-core raised is the finding
        return f"{type(error).__name__}: {error}"
    finally:
        parallel_state.destroy_model_parallel()


def _worker() -> None:
    import torch

    from ascend_engine.parallel import destroy_parallel

    results = {name: _attempt(name) for name in CASES}
    if torch.distributed.get_rank() == 0:
        print(json.dumps(results), flush=True)
    destroy_parallel()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from rank_process import run_rank

    run_rank(_worker)
