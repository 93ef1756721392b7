"""Megatron-LM's own pretrain_gpt.py (core_v0.12.1) as a bring-your-own job on the local cluster: 2 pods x 1
process, tensor parallel 2 over gloo on CPU, mock data. Its own iteration lines reach status.progress while it
runs, a killed worker restarts the gang and Megatron resumes from its own checkpoint, and a run it refuses fails
with its own error message as the cause.

Runs only with ``MEGATRON_LM=/path/to/Megatron-LM`` (a core_v0.12.1 checkout; nothing of it is in this
repository). The checkout must be writable: Megatron builds its dataset helpers there with ``make`` on first use
(g++ and ``pip install pybind11``); it also imports ``six`` and ``einops``. On CPU the pods run pretrain_gpt.py
through a three-line runner (written here) that applies the engine's CPU device shim (what torch_npu's
transfer_to_npu does for NPUs) and turns off what compiles CUDA kernels; Megatron's code is not changed.
"""
from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from ascend_cluster.cluster import LocalCluster

from workspace import create_workspace, quickstart_job  # noqa: E402

pytestmark = pytest.mark.e2e

MEGATRON_LM = os.environ.get("MEGATRON_LM")
TRAIN_ITERS = 100  # room to see a checkpoint and kill a worker before the end

CPU_RUNNER = """import os, runpy, sys
import torch
from ascend_engine.device import select_backend
select_backend("cpu").apply()  # Megatron's CUDA calls land on the CPU
torch.cuda.is_available = lambda: True  # initialize_megatron asserts CUDA
torch.cuda.set_device = lambda device: None
for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
    setattr(torch.cuda, name, lambda device=None: 0)
import megatron.legacy.fused_kernels as fused_kernels
import megatron.training.training as training
fused_kernels.load = lambda args: None  # builds CUDA kernels
training.set_jit_fusion_options = lambda *a, **k: None  # warms up torch.compile'd CUDA fusions
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
runpy.run_path(sys.argv[0], run_name="__main__")
"""
MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
         "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size", "4",
         "--lr", "1e-3", "--lr-warmup-iters", "2", "--tokenizer-type", "NullTokenizer", "--vocab-size", "256",
         "--transformer-impl", "local", "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion",
         "--no-bias-gelu-fusion", "--no-bias-dropout-fusion", "--no-rope-fusion", "--no-persist-layer-norm",
         "--use-cpu-initialization", "--distributed-backend", "gloo", "--tensor-model-parallel-size", "2",
         "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "1000", "--ckpt-format", "torch",
         "--save-interval", "5"]


def megatron_job(name: str, runner: Path, data: list[str]) -> dict:
    megatron = str(Path(MEGATRON_LM).resolve())
    return {
        "apiVersion": "ascendtrain.dev/v1alpha1", "kind": "AscendTrainJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "image": "my-team/megatron-lm:core_v0.12.1", "nnodes": 2, "nprocPerNode": 1,
            "devices": {"resource": "none"}, "shmSize": "none",
            "volumes": [{"name": "workspace", "persistentVolumeClaim": {"claimName": "ascend-workspace"}}],
            "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"}],
            "env": [{"name": "PYTHONPATH", "value": os.pathsep.join([megatron, os.environ.get("PYTHONPATH", "")])},
                    {"name": "CUDA_VISIBLE_DEVICES", "value": ""}],
            "runPolicy": {"backoffLimit": 1},
            "trainer": {"command": ["torchrun", str(runner), f"{megatron}/pretrain_gpt.py"],
                        "args": [*MODEL, *data, "--train-iters", str(TRAIN_ITERS),
                                 "--save", f"/workspace/checkpoints/{name}", "--load", f"/workspace/checkpoints/{name}"]},
        },
    }


@pytest.mark.skipif(not MEGATRON_LM, reason="set MEGATRON_LM to a Megatron-LM core_v0.12.1 checkout to run "
                                            "its pretrain_gpt.py as a bring-your-own job")
def test_megatron_lm_pretrain_gpt_as_a_byo_job(tmp_path):
    runner = tmp_path / "cpu_runner.py"
    runner.write_text(CPU_RUNNER)
    seen: list[dict] = []
    with LocalCluster(fast_storage=True, root=tmp_path / "cluster", operator=True) as cluster:
        create_workspace(cluster)
        resources = cluster.client()
        atj = resources.resolve("atj")
        resources.apply(megatron_job("megatron", runner, ["--mock-data"]))
        resources.apply(megatron_job("megatron-nodata", runner, ["--data-path", "/workspace/no-such-corpus"]))

        def status(name):
            return resources.get(atj, name, "default").get("status") or {}

        deadline = time.monotonic() + 900
        while (status("megatron").get("progress") or {}).get("lastCheckpointIteration", 0) < 10:
            assert time.monotonic() < deadline, f"no checkpoint at 10 yet: {status('megatron')}"
            if status("megatron").get("phase") == "Running" and (status("megatron").get("progress") or {}).get("loss"):
                seen.append(status("megatron")["progress"])
            time.sleep(0.5)
        saved_before_kill = status("megatron")["progress"]["lastCheckpointIteration"]
        cluster.runner.kill("default", "megatron-1-0", signal.SIGKILL)
        while status("megatron").get("phase") not in ("Succeeded", "Failed") or \
                status("megatron-nodata").get("phase") not in ("Succeeded", "Failed"):
            assert time.monotonic() < deadline, f"did not finish: {status('megatron')} {status('megatron-nodata')}"
            time.sleep(0.5)
        final, nodata = status("megatron"), status("megatron-nodata")
        # Each rank's log over both attempts (pod megatron-<index>-<attempt>; the local runner keeps the stopped ones').
        logs = {i: "".join((cluster.root / "pods" / "default" / f"megatron-{i}-{a}" / "container.log").read_text()
                           for a in (0, 1)) for i in (0, 1)}
        resources.close()
    # Live figures were Megatron's own: each loss seen in status is one its last rank printed at that iteration.
    printed = {int(m.group(1)): float(m.group(2)) for m in
               re.finditer(r"iteration\s+(\d+)/\s*\d+ \|.*? lm loss: (\S+) \|", logs[1])}
    assert seen, "no live progress while Running"
    for p in seen:
        assert p["loss"] == pytest.approx(printed[p["iteration"]], rel=1e-4), (p, printed)
    assert final["phase"] == "Succeeded", final
    assert final["restarts"] == 1
    assert final["progress"]["iteration"] == final["progress"]["trainIters"] == TRAIN_ITERS
    assert final["progress"]["tokensPerSecond"] > 0
    loaded = re.findall(r"successfully loaded checkpoint from \S+ .* at iteration (\d+)", logs[0])
    assert len(loaded) == 1 and int(loaded[0]) >= saved_before_kill, logs[0][-3000:]
    failed = next(c for c in nodata["conditions"] if c["type"] == "Failed")
    print(f"live progress seen at iterations {sorted({p['iteration'] for p in seen})}; killed pod 1 after checkpoint "
          f"{saved_before_kill}, resumed at {loaded[0]}; final {final['progress']}; "
          f"Megatron-LM's own failure cause: {failed['message']}")
    assert nodata["phase"] == "Failed" and "no-such-corpus" in failed["message"], failed
