"""bf16, fp16 (dynamic loss scaling) and activation recomputation train the same model as fp32.

Single process (no torchrun needed). Recomputation repeats the same fp32 arithmetic: its losses agree with fp32's
within float32's rounding over the way they travelled (tests/float_bounds.py; in practice equal). 16-bit runs
round each layer's inputs and weights to 16 bits (unit roundoff u16: 2**-8 for bf16, 2**-11 for fp16) and
accumulate in float32, so each of the (layers + 2) stages puts a relative u16 on what it computes, and the
cross-entropy moves by a logit's error twice (the target's logit and the log-sum-exp): 2 x 4 x u16 x the logits'
size, at most 1.5 for this model over these steps, about 4.7e-2 for bf16 (1e-2 of these losses of 4.9, the former
allowance) and 5.9e-3 for fp16 (the former 1e-2 was 8x wider); measured 3.0e-3 and 1.3e-4.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml

from float_bounds import assert_curves_agree, model_delta
from test_train_torchrun import LINE, TINY

LOGITS = 1.5  # the largest |logit| of this model over its first steps (measured 0.56 at initialisation, 1.27 after 3)

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
@pytest.mark.parametrize("flags,u16", [(["--bf16"], 2.0 ** -8), (["--fp16"], 2.0 ** -11),
                                       (["--recompute-granularity", "full"], None)])
def test_precision_and_recompute_match_fp32(tmp_path, fp32, flags, u16):
    losses, stdout = run_single(tmp_path, *flags)
    assert len(losses) == len(fp32) == 3
    if u16 is None:
        assert_curves_agree(fp32, losses, model_delta(CONFIG["model"], 32), "recomputation", from_log=True)
    else:
        bound = 2 * (CONFIG["model"]["numLayers"] + 2) * u16 * LOGITS
        print(f"{flags}: {max(abs(a - b) for a, b in zip(fp32, losses)):.1e} from fp32, bound {bound:.1e}")
        for a, b in zip(fp32, losses):
            assert abs(a - b) <= bound, (flags, fp32, losses)
    if flags == ["--fp16"]:
        assert re.search(r"loss scale: 65536\.0", stdout), "fp16 must report its dynamic loss scale"
