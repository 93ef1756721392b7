"""Converted checkpoints load into megatron-core's GPTModel under torchrun on CPU and give the HF model's logits.

One torchrun launch of four processes goes through the (TP, PP) layouts in turn (the ranks left over are data
parallel replicas): for each it loads every family's shards (strict load_state_dict), runs the forward pass
stage to stage, gathers the vocab-parallel logits and saves them; each layout's test compares them with the HF
model's forward in fp32, within float32's rounding of one forward (tests/float_bounds.py: sqrt(K) x (layers + 2) x
2**-24 = 5.7e-6 to 6.2e-6 of the largest logit, K the longest reduction, the vocabulary here; 8.0e-6 to 1.0e-5 for
these logits of up to 1.6, where the former fixed 1e-4 was 10-12x wider; measured: up to 8.3e-7 with AVX-512
kernels, 1.1e-6 with AVX2's, 0.11 of the bound), and the same greedy token wherever the reference's top two logits
are further apart than twice that. One launch, not one per layout: each rank's
Megatron import costs seconds of CPU. Run as a script, this file is the torchrun worker.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from float_bounds import decided, forward_atol, hf_delta  # noqa: E402

LAYOUTS = [(1, 1), (2, 1), (1, 2), (2, 2)]
BATCH, SEQ = 2, 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """HF models, their logits on fixed tokens, their conversions to every layout, and one torchrun over all."""
    from ascend_engine.cli import main
    from test_convert_models import FAMILY_CONFIGS, make_hf_model

    root = tmp_path_factory.mktemp("parity")
    torch.manual_seed(1)
    for family, spec in FAMILY_CONFIGS.items():
        model = make_hf_model(family, root / family / "hf")
        tokens = torch.randint(0, spec["vocab_size"], (BATCH, SEQ))
        with torch.no_grad():
            logits = model(tokens).logits
        torch.save({"tokens": tokens, "logits": logits}, root / family / "reference.pt")
        for tp, pp in LAYOUTS:
            assert main(["convert", "--load-dir", str(root / family / "hf"), "--save-dir",
                         str(root / family / f"tp{tp}pp{pp}"), "--target-tensor-parallel-size", str(tp),
                         "--target-pipeline-parallel-size", str(pp)]) == 0
    families = sorted(FAMILY_CONFIGS)
    world = max(tp * pp for tp, pp in LAYOUTS)
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", str(world), "--master-addr",
           "127.0.0.1", "--master-port", str(free_port()), __file__, str(root), *families]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-6000:]}"
    return root, families


@pytest.mark.engine
@pytest.mark.parametrize("tp,pp", LAYOUTS)
def test_megatron_logits_match_hf(converted, tp, pp):
    root, families = converted
    figures = {}
    for family in families:
        ref = torch.load(root / family / "reference.pt")
        got = torch.load(root / family / f"logits_tp{tp}pp{pp}.pt")
        vocab = ref["logits"].shape[-1]
        assert got.shape[-1] >= vocab
        diff = (got[..., :vocab] - ref["logits"]).abs().max().item()
        atol = forward_atol(ref["logits"], hf_delta(root / family / "hf" / "config.json", SEQ))
        figures[family] = f"{diff:.2e} of {atol:.2e}"
        assert diff <= atol, f"{family} tp{tp}pp{pp}: max abs logit difference {diff}, over {atol}"
        # greedy next tokens over the whole padded vocab (padding rows repeat the last real row, never win),
        # wherever rounding cannot swap the top two
        sure = decided(ref["logits"], atol)
        assert torch.equal(got.argmax(-1)[sure], ref["logits"].argmax(-1)[sure]), family
    print(f"parity tp{tp}pp{pp}: " + json.dumps(figures))


def _worker(root: Path, families: list[str]) -> None:
    """One torchrun rank: for each layout, load this rank's shard of each family and run the pipeline forward."""
    from ascend_engine.parallel import destroy_parallel

    for tp, pp in LAYOUTS:
        _forward_layout(root, tp, pp, families)
    destroy_parallel()


def _forward_layout(root: Path, tp: int, pp: int, families: list[str]) -> None:
    from megatron.core import parallel_state

    from ascend_engine.checkpoint.layout import checkpoint_file, read_latest
    from ascend_engine.config.train import ParallelConfig
    from ascend_engine.convert.megatron_io import model_config_from_args
    from ascend_engine.device import select_backend
    from ascend_engine.models.gpt import build_gpt_model
    from ascend_engine.parallel import init_parallel

    info = init_parallel(select_backend("cpu"), tp, pp, seed=0)
    for family in families:
        ckpt_root = root / family / f"tp{tp}pp{pp}"
        state = torch.load(checkpoint_file(ckpt_root, read_latest(ckpt_root), info.tp_rank, info.pp_rank, pp),
                           weights_only=False)
        model_cfg = model_config_from_args(state["args"], str(ckpt_root))
        model = build_gpt_model(model_cfg, ParallelConfig(tensorModelParallelSize=tp, pipelineModelParallelSize=pp),
                                seq_length=SEQ)
        model.load_state_dict(state["model"], strict=True)
        model.eval()
        tokens = torch.load(root / family / "reference.pt")["tokens"]
        positions = torch.arange(SEQ).unsqueeze(0).expand(BATCH, -1)
        with torch.no_grad():
            if not info.is_first_stage:
                hidden = torch.empty(SEQ, BATCH, model_cfg.hiddenSize)
                torch.distributed.recv(hidden, parallel_state.get_pipeline_model_parallel_prev_rank())
                model.set_input_tensor(hidden)
            out = model(tokens, positions, None)
            if not info.is_last_stage:
                torch.distributed.send(out.contiguous(), parallel_state.get_pipeline_model_parallel_next_rank())
                continue
            parts = [torch.empty_like(out) for _ in range(tp)]
            torch.distributed.all_gather(parts, out.contiguous(), group=parallel_state.get_tensor_model_parallel_group())
            if info.tp_rank == 0 and info.dp_rank == 0:
                torch.save(torch.cat(parts, dim=-1), root / family / f"logits_tp{tp}pp{pp}.pt")
    parallel_state.destroy_model_parallel()


if __name__ == "__main__":
    from rank_process import run_rank

    run_rank(_worker, Path(sys.argv[1]), sys.argv[2:])
