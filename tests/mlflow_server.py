"""A real MLflow tracking server for the tracker tests (``mlflow server`` on a sqlite store, one worker, loopback).

It takes 20-40 s to answer on a loaded 2-core machine, so tests start it first and let the engine's MLflow client
retry (``CLIENT_ENV``: after 1, 2, 4 ... s instead of 2, 4, 8 ...) while the run imports torch and builds its model.
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

# For the engine's processes: retry a server that is still starting, soon.
CLIENT_ENV = {"MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "10"}


def wait_ready(url: str, timeout: float = 180.0) -> None:
    """Until the server answers ``/health`` (polled every 0.2 s: tighter than the client's backoff)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def importable() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(p) for p in ("mlflow", "wandb"))


@contextlib.contextmanager
def mlflow_server(root: Path) -> Iterator[str]:
    """Yield the server's URL; its log is ``root/server.log``."""
    root.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(root / "server.log", "w") as log:
        server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                                   f"sqlite:///{root}/mlflow.db", "--default-artifact-root", str(root / "artifacts"),
                                   "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                                  stdout=log, stderr=subprocess.STDOUT,
                                  env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})  # no job runner
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
