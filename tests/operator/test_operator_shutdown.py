"""SIGTERM under load ends the operator within its grace period, also when the API server has stopped
answering (a request would otherwise wait forever, and kopf would wait for it).

The operator reaches the session's kube-apiserver through a TCP relay of the test's; "the API server stops
answering" is the relay dropping every connection and then accepting new ones (the kernel's backlog) without
ever answering, as a hung server or a black-holed network does."""
from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes import client

from test_operator_train_job import create, job, operator_command, operator_env, wait_for

pytestmark = pytest.mark.operator

GRACE_S = 3


class Relay:
    """Relays 127.0.0.1:<port> to ``target`` until ``silence()``: then every relayed connection is cut and the
    listening socket accepts nothing more, so new connections hang in its backlog unanswered."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
        self.listener.settimeout(0.1)
        self.port = self.listener.getsockname()[1]
        self.silent = threading.Event()
        self.closed = threading.Event()
        self.open: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.silent.is_set() and not self.closed.is_set():
            try:
                downstream, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.open += [downstream, upstream]
            for a, b in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def silence(self) -> None:
        self.silent.set()
        with self.lock:
            for s in self.open:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        self.closed.set()
        self.silence()
        self.listener.close()


def test_sigterm_exits_within_the_grace_period_against_a_silent_api_server(api_client, kubeconfig, namespace,
                                                                          tmp_path):
    for i in range(12):  # pods stay Pending (no nodes): every job is reconciled on every sweep
        create(api_client, namespace, job(f"load-{i}"))
    config = yaml.safe_load(kubeconfig.read_text())
    server = urlsplit(config["clusters"][0]["cluster"]["server"])
    relay = Relay((server.hostname, server.port))
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{relay.port}"
    relayed = tmp_path / "relayed-kubeconfig"
    relayed.write_text(yaml.safe_dump(config))
    env = operator_env(relayed, ASCEND_OPERATOR_PROGRESS_INTERVAL="0.2",
                       ASCEND_OPERATOR_SHUTDOWN_GRACE=str(GRACE_S))
    with open(tmp_path / "operator.log", "w") as log:
        operator = subprocess.Popen(operator_command(namespace, "--standalone"), env=env, stdout=log,
                                    stderr=subprocess.STDOUT)
    try:
        core = client.CoreV1Api(api_client)
        wait_for(lambda: len(core.list_namespaced_pod(namespace).items) >= 24, timeout=120, what="all pods")
        relay.silence()
        time.sleep(1.0)  # the sweep's calls are now waiting on it
        started = time.monotonic()
        operator.send_signal(signal.SIGTERM)
        operator.wait(GRACE_S + 15)
        took = time.monotonic() - started
    finally:
        if operator.poll() is None:
            operator.kill()
            operator.wait()
        relay.close()
    assert took < GRACE_S + 2, f"took {took:.1f}s\n" + (tmp_path / "operator.log").read_text()[-3000:]
    assert "SIGTERM received: stopping within 3s" in (tmp_path / "operator.log").read_text()
