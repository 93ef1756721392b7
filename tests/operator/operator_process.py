"""``ascend-operator run`` as a process a test can pause, kill and start again many times a minute.

A fault sequence kills and starts the operator about twice a sequence; a cold start spends 2 s of CPU importing
kopf, the Kubernetes client and the models before it reads a byte from the API server, and on two cores that import,
not the operator's work, was what bounded a long run. So each start is forked from one process that has imported
what ``ascend-operator run`` imports and waits (a zygote): the child runs the operator's own ``main`` from there,
the same code a cold start runs after its imports. Cold starts stay the business of the HA tests.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

from fake_kubelet import wait

ZYGOTE = """import json, os, signal, sys, traceback
import kopf, kubernetes.client
from ascend_operator import main
from ascend_operator.kinds import single_pod, train_job
from ascend_operator.lifecycle import startup, workers
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the children are reaped as they end; the test sees them gone
for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.dup2(2, 1)
        code = 1
        try:
            code = main.main(json.loads(line))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os._exit(code or 0)
    print(pid, flush=True)
"""


class Operator:
    """One operator at a time, ``--standalone``, watching ``namespace``; ``up`` while it runs and is not paused."""

    def __init__(self, env: dict[str, str], argv: list[str], health_port: int, metrics_port: int, log) -> None:
        self.argv, self.health, self.metrics, self.log = argv, health_port, metrics_port, log
        self.zygote = subprocess.Popen([sys.executable, "-c", ZYGOTE], env=env, stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=log, text=True)
        self.pid: int | None = None
        self.paused = False

    @property
    def running(self) -> bool:
        return self.pid is not None

    @property
    def up(self) -> bool:
        return self.pid is not None and not self.paused

    def start(self) -> None:
        self.zygote.stdin.write(json.dumps(self.argv) + "\n")
        self.zygote.stdin.flush()
        self.pid, self.paused = int(self.zygote.stdout.readline()), False
        wait(self.ready, 60, "the operator ready (its caches listed)")

    def kill(self) -> None:
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGKILL)
        self._gone(10)

    def pause(self, on: bool) -> None:
        self._signal(signal.SIGSTOP if on else signal.SIGCONT)
        self.paused = on

    def stop(self) -> None:
        if self.pid is not None:
            self._signal(signal.SIGCONT)
            self._signal(signal.SIGTERM)
            self._gone(30)
        self.zygote.stdin.close()
        self.zygote.wait(10)

    def ready(self) -> bool:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.health}/readyz", timeout=2).status == 200
        except OSError:
            return False

    def idle(self) -> bool:
        """Nothing queued or being reconciled and no informer listing (its metrics): it has acted on what it saw."""
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics", timeout=2).read().decode()
        except OSError:
            return False
        values = dict(line.split()[:2] for line in text.splitlines()
                      if line.startswith(("ascend_operator_workqueue_depth ", "ascend_operator_informers_listing ")))
        return len(values) == 2 and all(float(v) == 0 for v in values.values())

    def _signal(self, signum: int) -> None:
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:
            pass

    def _gone(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                self.pid, self.paused = None, False
                return
            time.sleep(0.02)
        raise AssertionError(f"operator {self.pid} still running {timeout}s after the signal")
