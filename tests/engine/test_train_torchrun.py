"""`ascend-engine train` under torchrun on CPU: two processes as TP=2 and as DP=2, a tiny GPT on a learnable pattern."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

VENV_BIN = Path(sys.executable).parent
LINE = re.compile(r"iteration\s+(\d+)/\s*(\d+) \| consumed samples:\s+(\d+) .*\| lm loss: (\S+) \|")

TINY = {
    "device": "cpu",
    "model": {"numLayers": 2, "hiddenSize": 64, "numAttentionHeads": 4, "vocabSize": 96},
    "training": {"microBatchSize": 2, "globalBatchSize": 4, "seqLength": 32, "trainIters": 10},
    "optimizer": {"lr": 3e-3, "lrDecayStyle": "constant"},
    "observability": {"metricsPort": 0},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_train(tmp_path: Path, config: dict, *flags: str, nproc: int = 2, name: str = "job.yaml",
              timeout: int = 120) -> tuple[subprocess.CompletedProcess, list[tuple[int, int, float]]]:
    """Run torchrun on CPU; return the process and (iteration, consumed samples, loss) per logged line."""
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    cmd = [str(VENV_BIN / "torchrun"), "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), "-m", "ascend_engine.cli", "train", "--config", str(path), *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    steps = [(int(m[1]), int(m[3]), float(m[4])) for m in LINE.finditer(proc.stdout)]
    return proc, steps


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"


@pytest.mark.engine
@pytest.mark.parametrize("layout", ["tp2", "dp2"])
def test_two_processes_train_and_save(tmp_path, layout):
    import torch

    config = {**TINY, "checkpoint": {"save": str(tmp_path / "ckpt")}}
    flags = ["--tensor-model-parallel-size", "2"] if layout == "tp2" else []
    proc, steps = run_train(tmp_path, config, *flags)
    assert_ok(proc)

    assert [s[0] for s in steps] == list(range(1, 11)), proc.stdout
    assert [s[1] for s in steps] == [4 * i for i in range(1, 11)]
    losses = [s[2] for s in steps]
    assert all(loss == loss and loss < 20 for loss in losses), losses
    assert losses[-1] < 0.8 * losses[0], f"loss did not fall on a repeating pattern: {losses}"
    assert "final lm loss" in proc.stderr and "checkpoint" in proc.stderr
    # third-party warnings (Megatron's fallbacks and defaults, torch deprecations) are filtered at the source
    assert "Warning:" not in proc.stderr, proc.stderr[-3000:]
    # the start-up says what it does (once, from rank 0) before the first iteration's line
    for stage in ("importing Megatron-core", "joining the process group", "building the model", "first step"):
        assert proc.stderr.count(f"s {stage}") == 1, proc.stderr[-3000:]

    root = tmp_path / "ckpt"
    assert (root / "latest_checkpointed_iteration.txt").read_text().strip() == "10"
    ranks = ["mp_rank_00", "mp_rank_01"] if layout == "tp2" else ["mp_rank_00"]
    assert sorted(p.name for p in (root / "iter_0000010").iterdir()) == ranks
    for rank in ranks:
        state = torch.load(root / "iter_0000010" / rank / "model_optim_rng.pt", weights_only=False)
        assert {"model", "args", "optimizer", "opt_param_scheduler", "rng_state", "checkpoint_version",
                "iteration"} <= set(state)
        assert state["iteration"] == 10 and state["checkpoint_version"] == 3.0
        args = state["args"]
        assert args.tensor_model_parallel_size == (2 if layout == "tp2" else 1)
        assert (args.num_layers, args.hidden_size, args.padded_vocab_size) == (2, 64, 128 * (2 if layout == "tp2" else 1))
        assert args.consumed_train_samples == 40
        model = state["model"]
        qkv = model["decoder.layers.1.self_attention.linear_qkv.weight"]
        assert qkv.shape == (3 * 64 // (2 if layout == "tp2" else 1), 64)
        assert "decoder.layers.0.input_layernorm.weight" in model and "output_layer.weight" in model
    assert not list(root.glob("*.tmp")), "staging folder left behind"
