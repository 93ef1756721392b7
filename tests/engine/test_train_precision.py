"""bf16, fp16 (dynamic loss scaling) and activation recomputation train the same model as fp32.

Single process (no torchrun needed). Recomputation repeats the same fp32 arithmetic (equal to 1e-6); 16-bit
runs round activations, so their first losses agree with fp32 to 1e-2 relative (bf16 has an 8-bit mantissa).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml

from test_train_torchrun import LINE, TINY

CONFIG = {**TINY, "model": {**TINY["model"], "paddedVocabSize": 128},
          "training": {**TINY["training"], "microBatchSize": 1, "globalBatchSize": 2, "trainIters": 3}}


def run_single(tmp_path, *flags: str) -> tuple[list[float], str]:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")}
    proc = subprocess.run([sys.executable, "-m", "ascend_engine.cli", "train", "--config", str(path), *flags],
                          capture_output=True, text=True, timeout=120, env={**env, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [float(m[4]) for m in LINE.finditer(proc.stdout)], proc.stdout


@pytest.fixture(scope="module")
def fp32(tmp_path_factory):
    return run_single(tmp_path_factory.mktemp("fp32"))[0]


@pytest.mark.engine
@pytest.mark.parametrize("flags,tolerance", [(["--bf16"], 1e-2), (["--fp16"], 1e-2),
                                             (["--recompute-granularity", "full"], 1e-6)])
def test_precision_and_recompute_match_fp32(tmp_path, fp32, flags, tolerance):
    losses, stdout = run_single(tmp_path, *flags)
    assert len(losses) == len(fp32) == 3
    for a, b in zip(fp32, losses):
        assert abs(a - b) <= tolerance * abs(a), (flags, fp32, losses)
    if flags == ["--fp16"]:
        assert re.search(r"loss scale: 65536\.0", stdout), "fp16 must report its dynamic loss scale"
