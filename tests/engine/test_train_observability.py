"""The log line's learning rate follows the configured schedule, and rank 0's metrics endpoint serves the
figures the operator copies into status.progress."""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import textwrap

import pytest
import yaml

from test_train_torchrun import LINE, TINY, free_port

LR = re.compile(r"iteration\s+(\d+)/.*?learning rate: (\S+) \|")

# The real Trainer in one process; after the run, read its own endpoint over HTTP as the operator does.
SCRAPE = textwrap.dedent("""
    import sys, urllib.request, yaml
    from ascend_engine.config.train import TrainConfig
    from ascend_engine.device import select_backend
    from ascend_engine.train.loop import Trainer
    cfg = TrainConfig.model_validate(yaml.safe_load(open(sys.argv[1])))
    Trainer(cfg, select_backend("cpu")).run()
    port = cfg.observability.metricsPort
    print(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())
""")


def expected_lr(step: int, peak: float, floor: float, warmup: int, total: int) -> float:
    """Megatron's schedule after ``step`` scheduler steps: linear warm-up from 0, then cosine to the floor."""
    if step <= warmup:
        return peak * step / warmup
    ratio = (step - warmup) / (total - warmup)
    return floor + 0.5 * (math.cos(math.pi * ratio) + 1) * (peak - floor)


@pytest.mark.engine
def test_schedule_in_log_line_and_metrics_endpoint(tmp_path):
    port = free_port()
    cfg = {**TINY, "training": {**TINY["training"], "trainIters": 6},
           "optimizer": {"lr": 1e-3, "minLr": 1e-4, "lrDecayStyle": "cosine", "lrWarmupIters": 2},
           "checkpoint": {"save": str(tmp_path / "ckpt"), "saveInterval": 4},
           "observability": {"metricsPort": port, "tensorboardDir": str(tmp_path / "tb")}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")}
    proc = subprocess.run([sys.executable, "-c", SCRAPE, str(path)], capture_output=True, text=True, timeout=120,
                          env={**env, "OMP_NUM_THREADS": "1", "POD_IP": "127.0.0.1"})
    assert proc.returncode == 0, proc.stderr[-4000:]

    logged = [(int(m[1]), float(m[2])) for m in LR.finditer(proc.stdout)]
    assert [i for i, _ in logged] == [1, 2, 3, 4, 5, 6]
    for i, lr in logged:
        assert lr == pytest.approx(expected_lr(i, 1e-3, 1e-4, 2, 6), rel=1e-6), (i, lr)

    metrics = dict(re.findall(r"^(ascend_\w+) (\S+)$", proc.stdout, re.M))
    last_loss = float(LINE.findall(proc.stdout)[-1][3])
    assert float(metrics["ascend_progress_iteration"]) == 6
    assert float(metrics["ascend_progress_total"]) == 6
    assert float(metrics["ascend_progress_percent"]) == 100
    assert float(metrics["ascend_train_loss"]) == pytest.approx(last_loss, rel=1e-5)
    assert float(metrics["ascend_train_learning_rate"]) == pytest.approx(1e-4, rel=1e-6)
    assert float(metrics["ascend_train_tokens_per_second"]) > 0 and 0 < float(metrics["ascend_train_mfu"]) < 1
    assert float(metrics["ascend_checkpoint_last_iteration"]) == 6  # saved at 4, then at the end
    assert float(metrics["ascend_progress_eta_seconds"]) == 0

    try:
        import tensorboard  # noqa: F401
    except ImportError:
        assert "tensorboard package is not installed" in proc.stderr
    else:
        assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
