"""SIGTERM under load ends the operator within its grace period, also when the API server has stopped
answering (a request would otherwise wait forever, and kopf would wait for it)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import yaml
from kubernetes import client

from test_operator_train_job import CRDS, GROUP, PLURAL, VERSION, job, wait_for

pytestmark = pytest.mark.operator

GRACE_S = 3


def test_sigterm_exits_within_the_grace_period_against_a_silent_api_server(local_api, api_client, tmp_path):
    ext = client.ApiextensionsV1Api(api_client)
    for path in sorted(CRDS.glob("*.yaml")):
        ext.create_custom_resource_definition(yaml.safe_load(path.read_text()))
    custom = client.CustomObjectsApi(api_client)
    for i in range(12):  # pods stay Pending (no runner): every job is reconciled on every sweep
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, job(f"load-{i}"))
    env = dict(os.environ, KUBECONFIG=str(tmp_path / "kubeconfig"), ASCEND_OPERATOR_PROGRESS_INTERVAL="0.2",
               ASCEND_OPERATOR_METRICS_PORT="0", ASCEND_OPERATOR_DASHBOARD_PORT="0",
               ASCEND_OPERATOR_SHUTDOWN_GRACE=str(GRACE_S))
    with open(tmp_path / "operator.log", "w") as log:
        operator = subprocess.Popen([sys.executable, "-m", "ascend_operator.main", "run", "-A", "--standalone"],
                                    env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        core = client.CoreV1Api(api_client)
        wait_for(lambda: len(core.list_namespaced_pod("default").items) >= 12, timeout=120, what="all pods")
        port = local_api.port
        local_api.stop()
        with socket.socket() as silent:  # accepts connections (the backlog) and never answers
            silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            silent.bind(("127.0.0.1", port))
            silent.listen(1024)
            time.sleep(1.0)  # the sweep's calls are now waiting on it
            started = time.monotonic()
            operator.send_signal(signal.SIGTERM)
            operator.wait(GRACE_S + 15)
            took = time.monotonic() - started
    finally:
        if operator.poll() is None:
            operator.kill()
            operator.wait()
    assert took < GRACE_S + 2, f"took {took:.1f}s\n" + (tmp_path / "operator.log").read_text()[-3000:]
    assert "SIGTERM received: stopping within 3s" in (tmp_path / "operator.log").read_text()
