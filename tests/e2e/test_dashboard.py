"""`ascend-train dashboard` in headless Chromium, on the local cluster.

1. A job trains with the operator: the dashboard's loss curve has exactly the iterations the engine logged (its
   rank-0 log), also across an operator restart mid-run (the history lives in a ConfigMap the operator owns), with
   axes, the phase badge, and a falling loss drawn falling; with the cluster gone the page says so in words.
2. A pipeline's objects with their statuses (no operator): the graph DatasetPrep -> CheckpointConvert ->
   AscendTrainJob -> evaluation -> export with phases and links, evaluation results per task, the failure cause,
   two runs on one chart, the log scale and smoothing.

Screenshots are kept as test artifacts (``$ASCEND_TEST_ARTIFACTS``, default ``test-artifacts/``); the test prints
their paths."""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ascend_cluster.cluster import LocalCluster
from ascend_cluster.resource_client import ApiRequestError
from ascend_cluster.runner import read_logs

from workspace import create_workspace, quickstart_job  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    shutil.which("chromium") is None, reason="chromium is not installed (Debian: apt-get install -y chromium)")]

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"
ARTIFACTS = Path(os.environ.get("ASCEND_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))
LOGGED = re.compile(r"^ iteration\s+(\d+)/\s*\d+ \|.*?\| lm loss: (\S+) \|", re.MULTILINE)


def chromium(url: str, profile: Path, *extra: str) -> str:
    command = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--no-first-run", f"--user-data-dir={profile}",
               "--virtual-time-budget=4000", *extra, url]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def screenshot(url: str, profile: Path, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / name
    chromium(url, profile, f"--screenshot={shot}", "--window-size=1280,1100")
    assert shot.stat().st_size > 10_000
    print(f"dashboard screenshot: {shot}")
    return shot


def chart(dom: str, job: str, series: str) -> str:
    """The <figure> of one series of one job."""
    section = dom.split(f'data-job="default/{job}"', 1)[1].split('<section class="job"', 1)[0]
    found = re.search(rf'<figure class="chart" data-series="{series}".*?</figure>', section, re.DOTALL)
    assert found, f"no {series} chart for {job}"
    return found.group(0)


def points(figure: str) -> list[tuple[int, float, float]]:
    """(iteration, value, drawn y) of every point of a chart."""
    return [(int(i), float(v), float(cy)) for cy, i, v in
            re.findall(r'<circle class="pt" r="[\d.]+" cx="[\d.]+" cy="([\d.]+)" data-iteration="(\d+)" '
                       r'data-value="([^"]+)"', figure)]


def assert_axes(figure: str) -> None:
    assert '<g class="axis x">' in figure and '<g class="axis y">' in figure
    assert ">iteration</text>" in figure
    assert len(re.findall(r'<g class="tick">', figure)) >= 4  # scales on both axes


class Dashboard:
    def __init__(self, cluster: LocalCluster):
        self.process = subprocess.Popen([sys.executable, "-m", "ascend_train.cli", "--root",
                                         str(cluster.root), "dashboard", "--port", "0"], stdout=subprocess.PIPE,
                                        text=True)
        self.url = re.search(r"http://\S+/", self.process.stdout.readline()).group(0)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        self.process.wait(30)


ITERS = 12


def test_the_dashboard_draws_every_logged_iteration_of_a_running_job(tmp_path):
    job = quickstart_job()
    job["metadata"]["name"] = "dash"
    job["spec"]["train"]["training"]["trainIters"] = ITERS
    job["spec"]["train"]["observability"]["logInterval"] = 1
    with LocalCluster(fast_storage=True, root=tmp_path / "cluster", operator=True) as cluster:
        create_workspace(cluster)
        resources = cluster.client()
        atj, cms = resources.resolve("atj"), resources.resolve("cm")
        resources.apply(job)
        dashboard = Dashboard(cluster)
        try:
            def history() -> list:
                try:
                    return json.loads(resources.get(cms, "dash-history", "default")["data"]["series.json"])
                except ApiRequestError:
                    return []

            deadline = time.monotonic() + 240
            while len(history()) < 3:
                assert time.monotonic() < deadline, resources.get(atj, "dash", "default").get("status")
                time.sleep(0.5)
            dom = chromium(dashboard.url, tmp_path / "profile", "--dump-dom")
            assert len(points(chart(dom, "dash", "loss"))) >= 3
            # The operator restarts mid-run: the history it kept survives and keeps growing from there.
            before = history()
            os.killpg(cluster.operator.pid, signal.SIGTERM)
            cluster.operator.wait(30)
            cluster.start_operator()
            while resources.get(atj, "dash", "default").get("status", {}).get("phase") not in ("Succeeded",
                                                                                              "Failed"):
                assert time.monotonic() < deadline + 240
                time.sleep(0.5)
            assert history()[:len(before)] == before
            logged = {int(i): float(loss) for i, loss in LOGGED.findall(read_logs(cluster.root, "default", "dash-0-0"))}
            assert sorted(logged) == list(range(1, ITERS + 1))
            kept = history()
            assert [p["iteration"] for p in kept] == sorted(logged)  # every logged iteration, none invented
            assert all(abs(p["loss"] - logged[p["iteration"]]) <= 1e-5 * abs(p["loss"]) for p in kept)

            dom = chromium(dashboard.url, tmp_path / "profile", "--dump-dom")
            assert 'data-phase="Succeeded"' in dom
            loss = chart(dom, "dash", "loss")
            assert_axes(loss)
            drawn = points(loss)
            assert [i for i, _, _ in drawn] == sorted(logged)
            # A falling loss is drawn falling: SVG y grows downwards.
            assert logged[1] > logged[ITERS] + 0.5 and drawn[0][2] < drawn[-1][2] - 30
            assert 'data-series="validationLoss"' not in dom  # no panel for a series the job does not have
            screenshot(dashboard.url, tmp_path / "profile", "dashboard.png")
        finally:
            resources.close()
            cluster_url = dashboard.url
    try:  # the cluster is gone: a sentence, not a client library's exception
        dom = chromium(cluster_url, tmp_path / "profile", "--dump-dom")
        banner = re.search(r'<div id="banner" role="alert" class="show"[^>]*>([^<]*)</div>', dom)
        assert banner and banner.group(1).startswith("Cannot reach the Kubernetes API at http"), dom[:3000]
        assert "HTTPConnectionPool" not in banner.group(1)
    finally:
        dashboard.stop()


def _status(resources, kind: str, name: str, status: dict) -> None:
    r = resources.resolve(kind)
    resources.request("PATCH", r.path("default", name, "status"), {"status": status},
                      content_type="application/merge-patch+json")


def _history(resources, job: dict, points: list) -> None:
    from ascend_operator.progress.history import config_map

    resources.apply(config_map(job, points))


def test_the_dashboard_shows_a_pipeline_its_evaluation_a_failure_and_two_runs_on_one_chart(tmp_path):
    docs = list(yaml.safe_load_all((QUICKSTART.parent / "pipeline.yaml").read_text()))
    failed = copy.deepcopy(next(d for d in docs if d["kind"] == "AscendTrainJob"))
    failed["metadata"]["name"] = "sft-b"
    failed["spec"].pop("evaluation", None)
    cause = "engine: ValueError: data.dataPath /workspace/data/alpaca_packed: no such dataset (pod sft-b-0)"
    # no operator: the statuses are set here
    with LocalCluster(fast_storage=True, root=tmp_path / "cluster") as cluster:
        resources = cluster.client()
        try:
            for doc in docs + [failed]:
                resources.apply(doc)
            jobs = {j["metadata"]["name"]: j for j in resources.list(resources.resolve("atj"), "default")}
            _status(resources, "dsp", "alpaca-prep", {"phase": "Succeeded"})
            _status(resources, "ckc", "qwen3-hf2mcore", {"phase": "Succeeded"})
            _status(resources, "ckc", "qwen3-mcore2hf", {"phase": "Running"})
            _status(resources, "atj", "sft", {
                "phase": "Succeeded", "progress": {"iteration": 60, "trainIters": 60, "percent": 100.0, "loss": 1.2},
                "recoveries": [  # as goodput.py writes them (tests/unit/test_goodput.py)
                    {"level": "InPlace", "reason": "WorkerFailed", "time": "2026-01-01T00:00:30.000Z",
                     "lostIterations": 3, "totalSeconds": 20.0, "seconds": {
                         "detection": 0.5, "stopping": 0.5, "podStart": 0.1, "rendezvous": 12.0,
                         "checkpointLoad": 2.9, "retrain": 4.0}},
                    {"level": "Replace", "reason": "InPlaceRecoveryExhausted", "time": "2026-01-01T00:01:00.000Z",
                     "lostIterations": 2, "totalSeconds": 40.0, "seconds": {
                         "detection": 1.0, "stopping": 5.0, "podStart": 14.0, "rendezvous": 12.0,
                         "checkpointLoad": 3.0, "retrain": 5.0}}],
                "goodput": {"goodput": 0.5, "wallSeconds": 200.0, "productiveSeconds": 100.0,
                            "recoverySeconds": 60.0, "otherSeconds": 40.0},
                "tracking": [{"tracker": "mlflow", "runId": "5f1e0c",
                              "url": "http://mlflow.example:5000/#/experiments/1/runs/5f1e0c"},
                             {"tracker": "wandb", "runId": "x1y2", "location": "/workspace/wandb/offline-run-x1y2"}],
                "evaluation": {"summary": "mmlu=0.42 gsm8k=0.1", "tasks": [
                    {"task": "mmlu", "accuracy": 0.42, "samples": 100, "seconds": 12.5},
                    {"task": "gsm8k", "accuracy": 0.1, "samples": 50, "seconds": 30.0}]}})
            _status(resources, "atj", "sft-b", {
                "phase": "Failed", "progress": {"iteration": 20, "trainIters": 60, "loss": 3.0},
                "conditions": [
                    {"type": "Created", "status": "True", "reason": "Created", "message": "created 2 pods",
                     "lastTransitionTime": "2026-01-01T00:00:00Z"},
                    {"type": "Failed", "status": "True", "reason": "EngineError", "message": cause,
                     "lastTransitionTime": "2026-01-01T00:01:00Z"},
                    {"type": "Running", "status": "False", "reason": "Failed", "message": "the job failed",
                     "lastTransitionTime": "2026-01-01T00:01:00Z"}]})
            _history(resources, jobs["sft"], [
                {"iteration": i, "time": "t", "loss": 5.0 * 0.97 ** i, "learningRate": 1e-4,
                 **({"validationLoss": 5.2 * 0.97 ** i} if i % 20 == 0 else {})} for i in range(1, 61)])
            _history(resources, jobs["sft-b"], [{"iteration": i, "time": "t", "loss": 5.0 * 0.99 ** i}
                                                for i in range(1, 21)])
            dashboard = Dashboard(cluster)
            try:
                url = dashboard.url + "#log=1&smooth=0.6&compare=default/sft:default/sft-b"
                dom = chromium(url, tmp_path / "profile", "--dump-dom")
                sft = dom.split('data-job="default/sft"', 1)[1].split('<section class="job"', 1)[0]
                nodes = re.findall(r'<li class="node" data-kind="([^"]+)" data-phase="([^"]+)">.*?<a href="([^"]+)">'
                                   r'([^<]+)</a>', sft)
                assert [(k, p, n) for k, p, _, n in nodes] == [
                    ("DatasetPrep", "Succeeded", "alpaca-prep"), ("CheckpointConvert", "Succeeded", "qwen3-hf2mcore"),
                    ("AscendTrainJob", "Succeeded", "sft"), ("evaluation", "Succeeded", "evaluation"),
                    ("CheckpointConvert", "Running", "qwen3-mcore2hf")]
                import urllib.request

                linked = json.loads(urllib.request.urlopen(dashboard.url.rstrip("/") + nodes[0][2]).read())
                assert linked["kind"] == "DatasetPrep" and linked["status"]["phase"] == "Succeeded"
                assert re.search(r'<tr data-task="mmlu"><td>mmlu</td><td>42.0%</td><td>100</td>', sft)
                assert '<tr data-task="gsm8k">' in sft
                # the tracker runs: a link to the online one, the offline one's folder
                assert ('<span data-tracker="mlflow">mlflow <a href="http://mlflow.example:5000/#/experiments/1/runs/'
                        '5f1e0c" target="_blank" rel="noopener">run 5f1e0c</a></span>') in sft
                assert '<span data-tracker="wandb">wandb run x1y2 (/workspace/wandb/offline-run-x1y2)</span>' in sft
                # goodput, and one stacked bar per recovery on one scale (the longest, 40 s, is the full width)
                assert 'data-goodput="0.5">goodput 50.0%: productive' in sft
                bars = re.findall(r'<div class="recovery" data-level="(\w+)">.*?</div></div>', sft)
                assert bars == ["InPlace", "Replace"], sft[sft.find("recoveries"):][:2000]
                widths = re.findall(r'data-part="(\w+)" style="width:([\d.]+)%"', sft)
                assert widths[:6] == [("detection", "1.25"), ("stopping", "1.25"), ("podStart", "0.25"),
                                      ("rendezvous", "30.00"), ("checkpointLoad", "7.25"), ("retrain", "10.00")]
                assert sum(float(w) for _, w in widths[6:]) == 100.0
                loss = chart(dom, "sft", "loss")
                assert_axes(loss)
                assert 'data-log="1"' in loss and "log scale" in loss  # the loss on a log axis
                assert '<path class="raw"' in loss and '<path class="line smoothed"' in loss
                assert 'data-compare="default/sft-b" data-compare-points="20"' in loss
                assert '<path class="line compare"' in loss
                assert len(points(chart(dom, "sft", "validationLoss"))) == 3
                failed_job = dom.split('data-job="default/sft-b"', 1)[1].split('<section class="job"', 1)[0]
                assert f'<div class="failure">{cause}</div>' in failed_job
                assert 'data-phase="Failed"' in failed_job and 'data-series="validationLoss"' not in failed_job
                screenshot(url, tmp_path / "profile", "dashboard-pipeline.png")
            finally:
                dashboard.stop()
        finally:
            resources.close()
