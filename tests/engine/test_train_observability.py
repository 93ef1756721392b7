"""The log line's learning rate follows the configured schedule, and rank 0's metrics endpoint serves the
figures the operator copies into status.progress."""
from __future__ import annotations

import json
import math
import os
import re
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from mlflow_server import CLIENT_ENV, importable, mlflow_server as start_mlflow_server
from test_train_torchrun import LINE, TINY, free_port

LR = re.compile(r"iteration\s+(\d+)/.*?learning rate: (\S+) \|")

# The real Trainer in one process; after the run, read its own endpoint over HTTP as the operator does.
SCRAPE = textwrap.dedent("""
    import sys, urllib.request, yaml
    from ascend_engine.config.train import TrainConfig
    from ascend_engine.device import select_backend
    from ascend_engine.train.loop import Trainer
    if len(sys.argv) > 2:  # an MLflow server still starting: wait for it here, after the imports, not in retries
        sys.path.insert(0, sys.argv[3])
        from mlflow_server import wait_ready
        wait_ready(sys.argv[2])
    cfg = TrainConfig.model_validate(yaml.safe_load(open(sys.argv[1])))
    Trainer(cfg, select_backend("cpu")).run()
    port = cfg.observability.metricsPort
    print(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())
    print("TRACKING", urllib.request.urlopen(f"http://127.0.0.1:{port}/tracking", timeout=10).read().decode())
""")


def expected_lr(step: int, peak: float, floor: float, warmup: int, total: int) -> float:
    """Megatron's schedule after ``step`` scheduler steps: linear warm-up from 0, then cosine to the floor."""
    if step <= warmup:
        return peak * step / warmup
    ratio = (step - warmup) / (total - warmup)
    return floor + 0.5 * (math.cos(math.pi * ratio) + 1) * (peak - floor)


# The experiment trackers' packages (dev extras); without them the run has no trackers and their test skips.
TRACKERS = importable()


def scrape_run(path, timeout: int = 180, tracking_uri: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")}
    wait = [tracking_uri, str(Path(__file__).resolve().parents[1])] if tracking_uri else []
    # POD_IP: served as in a pod; no series reader, so no wait for one at exit (ASCEND_SERIES_FLUSH_SECONDS)
    return subprocess.run([sys.executable, "-c", SCRAPE, str(path), *wait], capture_output=True, text=True,
                          timeout=timeout,
                          env={**env, "OMP_NUM_THREADS": "1", "POD_IP": "127.0.0.1", "ASCEND_SERIES_FLUSH_SECONDS": "0",
                               "ASCEND_JOB_NAME": "observed", "WANDB_SILENT": "true", **CLIENT_ENV})


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server, started while the first run imports torch (its client retries)."""
    if not TRACKERS:
        yield None
        return
    with start_mlflow_server(tmp_path_factory.mktemp("mlflow")) as url:
        yield url


@pytest.fixture(scope="module")
def observed(tmp_path_factory, mlflow_server) -> dict:
    """One tiny run of 6 iterations (checkpoints at 4 and 6) with TensorBoard, the metrics endpoint and, where
    the packages are, an MLflow and an offline W&B tracker."""
    tmp_path = tmp_path_factory.mktemp("observed")
    cfg = {**TINY, "training": {**TINY["training"], "trainIters": 6},
           "optimizer": {"lr": 1e-3, "minLr": 1e-4, "lrDecayStyle": "cosine", "lrWarmupIters": 2},
           "checkpoint": {"save": str(tmp_path / "ckpt"), "saveInterval": 4},
           "observability": {"metricsPort": free_port(), "tensorboardDir": str(tmp_path / "tb")}}
    if mlflow_server:
        cfg["observability"]["trackers"] = [
            {"type": "mlflow", "trackingUri": mlflow_server, "experiment": "observability"},
            {"type": "wandb", "project": "observability", "mode": "offline", "dir": str(tmp_path / "wb")}]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return {"tmp": tmp_path, "cfg": cfg, "path": path, "proc": scrape_run(path, tracking_uri=mlflow_server)}


@pytest.mark.engine
def test_schedule_in_log_line_and_metrics_endpoint(observed):
    tmp_path, proc = observed["tmp"], observed["proc"]
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


def wandb_records(run_dir: Path) -> list:
    """The protobuf records of an offline W&B run (its ``run-<id>.wandb``: a 7-byte header, then LevelDB-log
    blocks of 32 KiB, each record chunk with a 7-byte header), read without wandb's own (Go) reader."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = next(run_dir.glob("run-*.wandb")).read_bytes()
    assert data[:4] == b":W&B"
    pos, block, out, pending = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if left < 7 or (length == 0 and kind == 0):
            pos += left
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or a record's last chunk
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def wandb_run(run_dir: Path) -> dict:
    """An offline run's id, its history rows and its config, as logged."""
    run_id, history, config = None, [], {}
    for r in wandb_records(run_dir):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            run_id = r.run.run_id
        elif kind == "history":
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
        elif kind == "config":
            config.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.config.update})
    return {"id": run_id, "history": history, "config": config}


def tracking_of(proc: subprocess.CompletedProcess) -> dict[str, dict]:
    """What rank 0 served at /tracking (the operator's status.tracking), by tracker."""
    return {t["tracker"]: t for t in json.loads(re.search(r"^TRACKING (.*)$", proc.stdout, re.M)[1])}


@pytest.mark.engine
@pytest.mark.skipif(not TRACKERS, reason="the mlflow and wandb packages (dev extras) are not installed")
def test_trackers_log_the_series_and_continue_the_run_after_a_resume(observed, mlflow_server):
    """MLflow (a real server) and W&B (offline) get the loss, learning rate, tokens/s and MFU per iteration, the
    resolved config and system info; a second run of the job, resumed from its checkpoint and longer, continues
    the same runs at iterations 7 and 8; an evaluation's results join them at the checkpoint's iteration."""
    import torch
    from mlflow import MlflowClient

    first, tmp_path = observed["proc"], observed["tmp"]
    assert first.returncode == 0, first.stderr[-4000:]
    losses = {int(m[1]): float(m[4]) for m in LINE.finditer(first.stdout)}
    tracked = tracking_of(first)
    run_id = tracked["mlflow"]["runId"]
    assert tracked["mlflow"]["url"].startswith(mlflow_server) and tracked["mlflow"]["url"].endswith(run_id)
    client = MlflowClient(mlflow_server)

    def history(name: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in client.get_metric_history(run_id, name)]

    assert history("loss") == [(i, pytest.approx(losses[i], rel=1e-6)) for i in range(1, 7)]
    assert [step for step, _ in history("learningRate")] == list(range(1, 7))
    assert history("learningRate")[-1][1] == pytest.approx(1e-4, rel=1e-6)
    assert all(v > 0 for _, v in history("tokensPerSecond")) and all(0 < v < 1 for _, v in history("mfu"))
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "observed"  # the job's name
    params, tags = run.data.params, run.data.tags
    assert params["training.trainIters"] == "6" and params["model.hiddenSize"] == "64"
    assert params["optimizer.lrDecayStyle"] == "cosine" and params["checkpoint.saveInterval"] == "4"
    assert tags["system.worldSize"] == "1" and tags["system.torch"] == torch.__version__
    assert tags["system.device"] == "cpu" and tags["system.host"] and tags["system.megatronCore"]

    offline = Path(tracked["wandb"]["location"])
    wb = wandb_run(offline)
    assert wb["id"] == tracked["wandb"]["runId"] and offline.parent == tmp_path / "wb" / "wandb"
    assert [(h["iteration"], pytest.approx(losses[h["iteration"]], rel=1e-6)) for h in wb["history"]] == \
        [(i, losses[i]) for i in range(1, 7)]
    assert wb["config"]["training"]["trainIters"] == 6 and wb["config"]["system"]["worldSize"] == 1

    # The same job again, resumed from its checkpoint (iteration 6) and two iterations longer.
    cfg = {**observed["cfg"], "training": {**observed["cfg"]["training"], "trainIters": 8},
           "optimizer": {**observed["cfg"]["optimizer"], "overrideOptParamScheduler": True},
           "checkpoint": {**observed["cfg"]["checkpoint"], "load": observed["cfg"]["checkpoint"]["save"]}}
    path = tmp_path / "longer.yaml"
    path.write_text(yaml.safe_dump(cfg))
    second = scrape_run(path)
    assert second.returncode == 0, second.stderr[-4000:]
    later = {int(m[1]): float(m[4]) for m in LINE.finditer(second.stdout)}
    assert sorted(later) == [7, 8]
    again = tracking_of(second)
    assert again["mlflow"]["runId"] == run_id and again["wandb"]["runId"] == wb["id"]
    assert f"mlflow run {run_id} continued" in second.stdout
    assert history("loss") == [(i, pytest.approx({**losses, **later}[i], rel=1e-6)) for i in range(1, 9)]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    # params cannot change in MLflow: the first value stays, the new one is a tag
    assert run.data.params["training.trainIters"] == "6" and run.data.tags["config.training.trainIters"] == "8"
    wb2 = wandb_run(Path(again["wandb"]["location"]))
    assert wb2["id"] == wb["id"] and Path(again["wandb"]["location"]) != offline  # one folder per process
    assert [(h["iteration"], h["loss"]) for h in wb2["history"]] == [(i, pytest.approx(later[i])) for i in (7, 8)]

    # ascend-engine evaluate's hook: results into the same runs, at the evaluated checkpoint's iteration
    from ascend_engine.train.trackers.evaluation import log_evaluation

    log_evaluation(cfg["checkpoint"]["save"], {"checkpoint": cfg["checkpoint"]["save"], "tasks": [
        {"task": "mmlu", "accuracy": 0.25, "samples": 8}, {"task": "gsm8k", "metrics": {"exact_match,strict-match": 0.5}}]})
    assert client.get_metric_history(run_id, "eval/mmlu/accuracy")[0].step == 8
    assert client.get_metric_history(run_id, "eval/gsm8k/exact_match/strict-match")[0].value == 0.5
    evaluated = [wandb_run(d) for d in sorted((tmp_path / "wb" / "wandb").glob("offline-run-*"))]
    assert len(evaluated) == 3 and {e["id"] for e in evaluated} == {wb["id"]}
    assert evaluated[-1]["history"][0]["eval/mmlu/accuracy"] == 0.25
