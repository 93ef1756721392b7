"""Mixture of experts on megatron-core's MoE layers under torchrun on CPU (gloo), with expert parallelism.

One 4-process torchrun launch (its start-up, four processes importing megatron-core on a few cores, costs more
than most of its layouts), running every layout one after another in the same world:

* converted tiny random HF Qwen3-MoE, Mixtral and Qwen2-MoE checkpoints at TP2 x EP2 and PP2 x EP2 load strictly
  into GPTModel and give transformers' logits (fp32, within float32's rounding of one forward: sqrt(K) x (layers +
  2) x 2**-24 of the largest logit, 6.2e-6 to 6.6e-6 here, where the former fixed 1e-4 was 15x wider; measured
  up to 7.5e-7 with AVX-512 and AVX2 kernels) and the same greedy tokens wherever rounding cannot swap the top two;
* training an MoE model (aux loss on) at EP1 (DP4), EP2, PP2 x EP2 and TP2 x EP2 (sequence parallel, which
  megatron-core requires for MoE with TP) gives the same loss curve and the same load-balancing loss within
  float32's rounding over the way each travelled (tests/float_bounds.py: 2.7e-6 of it, 1.3e-5 for these losses
  of 4.9 falling to 3.8; the former 1e-3 relative, 4.9e-3, was 370x wider; measured: at most 0.02 of the bound,
  0.04 for the load-balancing loss). A router choice is the one discrete step: a token whose second and third
  expert scores were within rounding of each other could switch experts on another CPU, a change not bounded by
  rounding. Over these runs' 1024 routing decisions the smallest such gap is 2.1e-5 in softmax score, about 50x
  the rounding-sized change of a score (2.7e-6 of router logits up to 0.64), so no CPU's rounding switches one;
  and a run stopped and resumed at EP2 continues bit for bit.

Run as a script, this file is the torchrun worker.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from float_bounds import assert_curves_agree, decided, forward_atol, hf_delta, model_delta  # noqa: E402

BATCH, SEQ = 2, 16
CONVERT_LAYOUTS = [(2, 1, 2), (1, 2, 2)]  # (tp, pp, ep)
TRAIN_LAYOUTS = {"ep1": (1, 1, 1), "ep2": (1, 1, 2), "pp2ep2": (1, 2, 2), "tp2ep2": (2, 1, 2)}
DENSE_MODEL = {"numLayers": 4, "hiddenSize": 64, "numAttentionHeads": 4, "vocabSize": 96, "paddedVocabSize": 128}
MOE_MODEL = {"numLayers": 2, "hiddenSize": 64, "numAttentionHeads": 4, "vocabSize": 96, "paddedVocabSize": 128,
             "ffnHiddenSize": 64, "numExperts": 4, "moeRouterTopk": 2, "moeFfnHiddenSize": 32,
             "moeAuxLossCoeff": 0.01, "moeTokenDispatcherType": "alltoall"}


def _torchrun(*args: str) -> None:
    from test_convert_parity import free_port

    cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", "4", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), __file__, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-6000:]}"


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """HF MoE models, their logits on fixed tokens, their conversions to each layout, and one torchrun over all:
    the converted checkpoints' logits, then the training layouts' curves (``converted`` and ``curves``)."""
    from ascend_engine.cli import main
    from test_convert_models import MOE_FAMILY_CONFIGS, make_hf_model

    root = tmp_path_factory.mktemp("moe_parity")
    torch.manual_seed(1)
    for family, spec in MOE_FAMILY_CONFIGS.items():
        model = make_hf_model(family, root / family / "hf")
        tokens = torch.randint(0, spec["vocab_size"], (BATCH, SEQ))
        with torch.no_grad():
            logits = model(tokens).logits
        torch.save({"tokens": tokens, "logits": logits}, root / family / "reference.pt")
        for tp, pp, ep in CONVERT_LAYOUTS:
            assert main(["convert", "--load-dir", str(root / family / "hf"), "--save-dir",
                         str(root / family / f"tp{tp}pp{pp}ep{ep}"), "--target-tensor-parallel-size", str(tp),
                         "--target-pipeline-parallel-size", str(pp), "--target-expert-parallel-size", str(ep)]) == 0
    (root / "train").mkdir()
    _torchrun(str(root), *MOE_FAMILY_CONFIGS)
    return root, sorted(MOE_FAMILY_CONFIGS)


@pytest.fixture(scope="module")
def converted(launched):
    return launched


@pytest.mark.engine
@pytest.mark.parametrize("tp,pp,ep", CONVERT_LAYOUTS)
def test_converted_moe_logits_match_transformers(converted, tp, pp, ep):
    root, families = converted
    for family in families:
        ref = torch.load(root / family / "reference.pt")
        got = torch.load(root / family / f"logits_tp{tp}pp{pp}ep{ep}.pt")
        vocab = ref["logits"].shape[-1]
        diff = (got[..., :vocab] - ref["logits"]).abs().max().item()
        atol = forward_atol(ref["logits"], hf_delta(root / family / "hf" / "config.json", SEQ))
        print(f"{family} tp{tp}pp{pp}ep{ep}: max abs logit difference {diff:.2e} of {atol:.2e}")
        assert diff <= atol, f"{family} tp{tp}pp{pp}ep{ep}: max abs logit difference {diff}, over {atol}"
        sure = decided(ref["logits"], atol)  # where rounding cannot swap the top two
        assert torch.equal(got.argmax(-1)[sure], ref["logits"].argmax(-1)[sure]), family


@pytest.fixture(scope="module")
def curves(launched):
    return json.loads((launched[0] / "train" / "curves.json").read_text())


@pytest.mark.engine
@pytest.mark.parametrize("layout", [name for name in TRAIN_LAYOUTS if name != "ep1"])
def test_moe_loss_curve_matches_ep1(curves, layout):
    base, run = curves["ep1"], curves[layout]
    assert len(run["loss"]) == len(base["loss"]) == 4
    d = model_delta(MOE_MODEL, 32)
    used = assert_curves_agree(base["loss"], run["loss"], d, f"{layout} loss")
    # the same router decisions give the same load-balancing loss
    balancing = assert_curves_agree(base["load_balancing_loss"], run["load_balancing_loss"], d,
                                    f"{layout} load balancing")
    print(f"{layout}: losses {run['loss']}, {used:.2f} of the float32 bound used, load balancing {balancing:.2f}")
    assert run["loss"][-1] < run["loss"][0]


@pytest.mark.engine
def test_moe_resume_is_bitwise(curves):
    """EP2 resumed from its iteration-2 checkpoint (mp_rank_00_000 / mp_rank_00_001) == uninterrupted."""
    assert curves["resumed"]["loss"] == curves["ep2"]["loss"][2:]
    assert curves["resumed"]["files"] == ["mp_rank_00_000/model_optim_rng.pt", "mp_rank_00_001/model_optim_rng.pt"]
    assert all(v > 0 for v in curves["ep2"]["load_balancing_loss"])


@pytest.mark.engine
def test_virtual_pipeline_matches_plain_pipeline(curves):
    """PP2 with two chunks per rank (interleaved schedule) == PP2 1F1B; chunks saved as model0/model1, resumed
    bitwise."""
    plain, interleaved = curves["pp2"]["loss"], curves["vpp2"]["loss"]
    assert len(plain) == len(interleaved) == 4
    used = assert_curves_agree(plain, interleaved, model_delta(DENSE_MODEL, 32), "pp2 against vpp2")
    print(f"vpp2: {used:.2f} of the float32 bound used")
    assert curves["vpp2_resumed"]["loss"] == interleaved[2:]
    keys = curves["vpp2_keys"]
    # PP rank 1 holds virtual stages 1 and 3: global layers 1 and 3, each its chunk's local layer 0
    assert sorted(keys) == ["model0", "model1"]
    assert "output_layer.weight" in keys["model1"] and "output_layer.weight" not in keys["model0"]
    assert all(not k.startswith("decoder.layers.1.") for k in keys["model0"] + keys["model1"])


# ---------------------------------------------------------------- torchrun worker


def _logits_worker(root: Path, families: list[str]) -> None:
    from megatron.core import parallel_state

    from ascend_engine.checkpoint.layout import checkpoint_file, read_latest
    from ascend_engine.config.train import ParallelConfig
    from ascend_engine.convert.megatron_io import model_config_from_args
    from ascend_engine.device import select_backend
    from ascend_engine.models.gpt import build_gpt_model
    from ascend_engine.parallel import init_parallel

    for tp, pp, ep in CONVERT_LAYOUTS:
        info = init_parallel(select_backend("cpu"), tp, pp, seed=0, ep=ep)
        for family in families:
            name = f"tp{tp}pp{pp}ep{ep}"
            ckpt = root / family / name
            path = checkpoint_file(ckpt, read_latest(ckpt), info.tp_rank, info.pp_rank, pp, info.ep_rank, ep)
            state = torch.load(path, weights_only=False)
            model_cfg = model_config_from_args(state["args"], str(path))
            model = build_gpt_model(model_cfg, ParallelConfig(tensorModelParallelSize=tp, pipelineModelParallelSize=pp,
                                                              expertModelParallelSize=ep), seq_length=SEQ)
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
                torch.distributed.all_gather(parts, out.contiguous(),
                                             group=parallel_state.get_tensor_model_parallel_group())
                if info.tp_rank == 0 and info.dp_rank == 0:
                    torch.save(torch.cat(parts, dim=-1), root / family / f"logits_{name}.pt")
        parallel_state.destroy_model_parallel()  # the process group stays for the training layouts


def _train_worker(root: Path) -> None:
    from megatron.core import parallel_state

    from ascend_engine.checkpoint.layout import write_latest
    from ascend_engine.config.train import TrainConfig
    from ascend_engine.device import select_backend
    from ascend_engine.parallel import destroy_parallel
    from ascend_engine.train.loop import Trainer

    def run(tp, pp, ep, model=MOE_MODEL, per_chunk=None, **checkpoint):
        cfg = TrainConfig.model_validate({
            "device": "cpu", "model": model,
            "parallel": {"tensorModelParallelSize": tp, "pipelineModelParallelSize": pp,
                         "expertModelParallelSize": ep, "sequenceParallel": tp > 1,
                         "numLayersPerVirtualPipelineStage": per_chunk},
            "training": {"microBatchSize": 1, "globalBatchSize": 4, "seqLength": 32, "trainIters": 4},
            "optimizer": {"lr": 3e-3, "lrDecayStyle": "constant"},
            "checkpoint": checkpoint, "observability": {"metricsPort": 0}})
        trainer = Trainer(cfg, select_backend("cpu"))
        balancing = []
        step = trainer.train_step

        def train_step():  # record the router's load-balancing loss of every step
            out = step()
            balancing.append(trainer.router_losses.get("load_balancing_loss"))
            return out

        trainer.train_step = train_step
        result = trainer.run()
        parallel_state.destroy_model_parallel()
        return {"loss": result.losses, "load_balancing_loss": balancing}

    def rewind(folder: Path, iteration: int) -> None:
        """Point the tracker back at an earlier checkpoint (as a user resuming from it would)."""
        if torch.distributed.get_rank() == 0:
            write_latest(folder, iteration)
        torch.distributed.barrier()

    # The uninterrupted runs save every 2 iterations; resuming from iteration 2 must give iterations 3, 4 again.
    curves = {name: run(*layout, **({"save": str(root / "ckpt"), "saveInterval": 2} if name == "ep2" else {}))
              for name, layout in TRAIN_LAYOUTS.items()}
    rewind(root / "ckpt", 2)
    curves["resumed"] = run(1, 1, 2, load=str(root / "ckpt"))
    folder = root / "ckpt" / "iter_0000002"
    curves["resumed"]["files"] = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.pt"))
    # virtual pipeline stages: 4 layers on PP2 as two chunks of one layer per rank (interleaved 1F1B), saved
    # as model0/model1 and resumed
    curves["pp2"] = run(1, 2, 1, model=DENSE_MODEL)
    curves["vpp2"] = run(1, 2, 1, model=DENSE_MODEL, per_chunk=1, save=str(root / "vpp"), saveInterval=2)
    rewind(root / "vpp", 2)
    curves["vpp2_resumed"] = run(1, 2, 1, model=DENSE_MODEL, per_chunk=1, load=str(root / "vpp"))
    state = torch.load(root / "vpp" / "iter_0000002" / "mp_rank_00_001" / "model_optim_rng.pt", weights_only=False)
    curves["vpp2_keys"] = {k: sorted(v) for k, v in state.items() if k.startswith("model")}
    if torch.distributed.get_rank() == 0:
        (root / "curves.json").write_text(json.dumps(curves))
    destroy_parallel()


if __name__ == "__main__":
    from rank_process import run_rank

    def _both(root: Path, families: list[str]) -> None:
        _logits_worker(root, families)
        _train_worker(root / "train")

    run_rank(_both, Path(sys.argv[1]), sys.argv[2:])
