"""`ascend-train dashboard` in headless Chromium while a job trains on the local cluster: the job's curves gain
points as it runs, and keep them across an operator restart (the history lives in a ConfigMap the operator owns).
A screenshot is kept as a test artifact (``$ASCEND_TEST_ARTIFACTS``, default ``test-artifacts/``)."""
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

from ascend_operator.local.cluster import LocalCluster
from ascend_operator.local.resource_client import ApiRequestError

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    shutil.which("chromium") is None, reason="chromium is not installed (Debian: apt-get install -y chromium)")]

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"
ARTIFACTS = Path(os.environ.get("ASCEND_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))


def chromium(url: str, profile: Path, *extra: str) -> str:
    command = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--no-first-run", f"--user-data-dir={profile}",
               "--virtual-time-budget=4000", *extra, url]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def loss_points(dom: str) -> int:
    found = re.search(r'data-series="loss" data-points="(\d+)"', dom)
    return int(found.group(1)) if found else 0


def test_the_dashboard_draws_growing_curves_of_a_running_job(tmp_path):
    job = copy.deepcopy(yaml.safe_load(QUICKSTART.read_text()))
    job["metadata"]["name"] = "dash"
    job["spec"]["train"]["training"]["trainIters"] = 400  # never the bottleneck: the test stops it early
    job["spec"]["train"]["observability"]["logInterval"] = 1
    with LocalCluster(root=tmp_path / "cluster", operator=True) as cluster:
        resources = cluster.client()
        atj, cms = resources.resolve("atj"), resources.resolve("cm")
        resources.apply(job)
        server = subprocess.Popen([sys.executable, "-m", "ascend_operator.local.cli", "--root", str(cluster.root),
                                   "dashboard", "--port", "0"], stdout=subprocess.PIPE, text=True)
        try:
            url = re.search(r"http://\S+/", server.stdout.readline()).group(0)

            def history() -> list:
                try:
                    return json.loads(resources.get(cms, "dash-history", "default")["data"]["series.json"])
                except ApiRequestError:
                    return []

            def wait_for_points(count: int) -> None:
                deadline = time.monotonic() + 240
                while len(history()) < count:
                    assert time.monotonic() < deadline, resources.get(atj, "dash", "default").get("status")
                    time.sleep(0.5)

            wait_for_points(2)
            first = loss_points(chromium(url, tmp_path / "profile", "--dump-dom"))
            assert first >= 2
            # The operator restarts mid-run: the history it kept survives and keeps growing from there.
            before = history()
            os.killpg(cluster.operator.pid, signal.SIGTERM)
            cluster.operator.wait(30)
            cluster.start_operator()
            wait_for_points(len(before) + 2)
            assert history()[:len(before)] == before
            dom = chromium(url, tmp_path / "profile", "--dump-dom")
            second = loss_points(dom)
            assert first < second, (first, second)
            assert 'class="job" data-job="default/dash"' in dom and "tokens/s" in dom and "ETA" in dom
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            shot = ARTIFACTS / "dashboard.png"
            chromium(url, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,900")
            assert shot.stat().st_size > 10_000
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(30)
            resources.close()
