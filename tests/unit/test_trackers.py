"""Experiment trackers (train.observability.trackers): credentials reach the pods from Secrets and never the
spec, a missing tracker package fails the run at once naming the package, and where the run is tracked travels
from rank 0 to status.tracking. The trackers themselves (a real MLflow server, W&B offline) are tested in
tests/engine/test_train_observability.py."""
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import yaml
from pydantic import ValidationError

from ascend_engine.config.train import TrainConfig
from ascend_engine.telemetry import Metrics
from ascend_engine.train.trackers import RUNS_FILE, TrackerError, read_runs, require_packages, status_records, write_runs
from ascend_engine.train.trackers.evaluation import evaluation_figures
from ascend_operator.api.train_job import AscendTrainJobSpec, AscendTrainJobStatus
from ascend_operator.progress.live import tracking as _tracking
from ascend_operator.render import train_job as render
from ascend_operator.lifecycle.status import derive

TRACKERS = [{"type": "mlflow", "trackingUri": "https://mlflow.example", "experiment": "llama",
             "credentialsSecret": "mlflow-token"},
            {"type": "wandb", "project": "llama", "entity": "team", "mode": "offline", "dir": "/ckpt/wandb",
             "credentialsSecret": "wandb-key"},
            {"type": "swanlab", "project": "llama", "mode": "local", "credentialsSecret": "wandb-key"}]


def _spec(trackers=TRACKERS, **overrides):
    return AscendTrainJobSpec.model_validate({"image": "engine:1", "nnodes": 2, "nprocPerNode": 1,
                                              "devices": {"resource": "none"},
                                              "train": {"observability": {"trackers": trackers}}, **overrides})


def test_tracker_credentials_come_from_secrets_into_the_pod_env_never_into_the_spec():
    spec = _spec(envFrom=[{"configMapRef": {"name": "proxy"}}])
    pod = render.pod("llm", "team-a", spec, 1)
    main = pod["spec"]["containers"][0]
    # each Secret once, after the user's own envFrom; its keys (WANDB_API_KEY, ...) become the environment
    assert main["envFrom"] == [{"configMapRef": {"name": "proxy"}}, {"secretRef": {"name": "mlflow-token"}},
                               {"secretRef": {"name": "wandb-key"}}]
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["ASCEND_JOB_NAME"] == "llm" and env["ASCEND_JOB_NAMESPACE"] == "team-a"
    assert not {"WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN", "SWANLAB_API_KEY"} & set(env)
    # the ConfigMap carries the trackers by Secret name only
    config = yaml.safe_load(render.engine_config_map("llm", spec)["data"]["config.yaml"])
    assert config["observability"]["trackers"][1] == {"type": "wandb", "project": "llama", "entity": "team",
                                                      "mode": "offline", "dir": "/ckpt/wandb",
                                                      "credentialsSecret": "wandb-key"}
    # no trackers: nothing added
    plain = render.pod("llm", "team-a", _spec(trackers=[]), 0)["spec"]["containers"][0]
    assert "envFrom" not in plain and "ASCEND_JOB_NAME" not in {e["name"] for e in plain["env"]}


@pytest.mark.parametrize("tracker, says", [
    ({"type": "wandb", "apiKey": "abc"}, "Extra inputs are not permitted"),
    ({"type": "mlflow", "trackingUri": "https://bob:s3cret@mlflow.example"}, "name a Secret in credentialsSecret"),
    ({"type": "mlflow"}, "mlflow needs trackingUri"),
    ({"type": "wandb", "trackingUri": "http://x"}, "trackingUri applies to mlflow, not wandb"),
    ({"type": "wandb", "mode": "local"}, "wandb mode is online or offline"),
    ({"type": "wandb", "credentialsSecret": "Not A Name"}, "should match pattern"),
])
def test_a_tracker_spec_refuses_credentials_and_fields_of_other_trackers(tracker, says):
    with pytest.raises(ValidationError, match=says):
        TrainConfig.model_validate({"observability": {"trackers": [tracker]}})


def test_each_tracker_once():
    with pytest.raises(ValidationError, match="names wandb more than once"):
        TrainConfig.model_validate({"observability": {"trackers": [{"type": "wandb"}, {"type": "wandb"}]}})


def test_a_missing_tracker_package_fails_the_run_at_once_naming_the_package(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "swanlab" else real(name, *a))
    cfg = TrainConfig.model_validate({"observability": {"trackers": [{"type": "swanlab"}]}})
    with pytest.raises(TrackerError, match=r"names swanlab, but the 'swanlab' package is not installed .*"
                                           r"\(pip install swanlab\)"):
        require_packages(cfg.observability.trackers)


def test_the_train_command_exits_non_zero_before_torch_when_a_tracker_package_is_missing(tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({"device": "cpu", "observability": {"trackers": [{"type": "swanlab"}]}}))
    # find_spec says swanlab is not there, even where it is installed
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import importlib.util as u\nreal = u.find_spec\n"
        "u.find_spec = lambda n, *a: None if n == 'swanlab' else real(n, *a)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide), os.environ.get("PYTHONPATH", "")]),
           "ASCEND_TERMINATION_LOG": str(tmp_path / "termination")}
    proc = subprocess.run([sys.executable, "-m", "ascend_engine", "train", "--config", str(config)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode != 0
    assert "the 'swanlab' package is not installed in this image (pip install swanlab)" in proc.stderr
    assert "importing torch" not in proc.stderr  # failed before anything heavy
    assert '"reason":"TrackerUnavailable"' in (tmp_path / "termination").read_text()


def test_run_ids_are_kept_beside_the_checkpoints(tmp_path):
    runs = {"mlflow|u|e": {"key": "mlflow|u|e", "tracker": "mlflow", "runId": "abc", "config": {"type": "mlflow"}}}
    write_runs(str(tmp_path), runs)
    assert read_runs(str(tmp_path)) == runs
    assert oct((tmp_path / RUNS_FILE).stat().st_mode & 0o777) == "0o644"
    assert read_runs(str(tmp_path / "none")) == {} and read_runs(None) == {}


def test_evaluation_results_become_tracker_metric_names():
    assert evaluation_figures({"tasks": [
        {"task": "mmlu", "accuracy": 0.5, "samples": 10},
        {"task": "gsm8k", "accuracy": None, "metrics": {"exact_match,strict-match": 0.25, "acc,none": 0.75}}]}) == {
        "eval/mmlu/accuracy": 0.5, "eval/mmlu/samples": 10.0, "eval/gsm8k/exact_match/strict-match": 0.25,
        "eval/gsm8k/acc": 0.75}


def test_where_the_run_is_tracked_reaches_status_tracking():
    metrics = Metrics()
    metrics.serve(0, "127.0.0.1")
    port = metrics.server.server_port
    records = [{"tracker": "mlflow", "runId": "abc", "url": "https://mlflow.example/#/experiments/1/runs/abc",
                "experimentId": "1", "resumed": False},
               {"tracker": "wandb", "runId": "x1", "location": "/ckpt/wandb/wandb/offline-run-1-x1", "resumed": True}]
    metrics.tracking = status_records(records)
    job = SimpleNamespace(metrics_port=lambda spec: port)
    pod = {"status": {"podIP": "127.0.0.1", "phase": "Running"}}
    spec = _spec(trackers=TRACKERS[:2])
    tracking = _tracking(job, spec, {}, [pod])
    assert tracking == [{"tracker": "mlflow", "runId": "abc", "url": "https://mlflow.example/#/experiments/1/runs/abc"},
                        {"tracker": "wandb", "runId": "x1", "location": "/ckpt/wandb/wandb/offline-run-1-x1"}]
    AscendTrainJobStatus.model_validate({"tracking": tracking})  # the CRD's status schema takes it
    assert _tracking(job, spec, {"tracking": tracking}, [pod]) is None  # known: not read again
    assert _tracking(job, _spec(trackers=[]), {}, [pod]) is None
    # kept by every later status (restarts keep the run ids)
    assert derive([], 2, {"phase": "Running", "tracking": tracking})["tracking"] == tracking
    metrics.server.shutdown()


def test_a_tracker_that_cannot_start_stops_the_run_and_the_others_keep_their_ids(tmp_path, monkeypatch):
    """MLflow starts, W&B refuses: the run fails (TrackerError), MLflow's run ends FAILED, and its id is already
    beside the checkpoints, so the restarted job continues it."""
    from ascend_engine.config.tracking import TrackerConfig
    from ascend_engine.train import trackers

    ended = []

    class Fake(trackers.TrackerRun):
        def start(self, run_id, name, config, system):
            if self.cfg.type == "wandb":
                raise ConnectionError("api.wandb.ai unreachable")
            return {"runId": run_id or "first"}

        def close(self, status="FINISHED"):
            ended.append((self.cfg.type, status))

    monkeypatch.setattr(trackers, "make_run", lambda cfg, default_dir: Fake(cfg, default_dir))
    monkeypatch.setattr(trackers, "require_packages", lambda _: None)
    named = [TrackerConfig(type="mlflow", trackingUri="http://m"), TrackerConfig(type="wandb")]
    with pytest.raises(TrackerError, match=r"wandb could not start its run \(ConnectionError: api.wandb.ai"):
        trackers.open_trackers(named, str(tmp_path), {}, {})
    assert ended == [("mlflow", "FAILED")]
    assert [r["runId"] for r in read_runs(str(tmp_path)).values()] == ["first"]
    opened = trackers.open_trackers(named[:1], str(tmp_path), {}, {})
    assert opened.records == [{"tracker": "mlflow", "runId": "first", "resumed": True}]
