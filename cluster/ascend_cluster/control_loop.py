"""``ControlLoop``: a thread that runs ``sync_once`` every ``poll_interval`` with an API client of its own, until
stopped (level-triggered, as controllers resync): the local cluster's volume provisioner."""
from __future__ import annotations

import logging
import threading
from pathlib import Path

from kubernetes import client, config

logger = logging.getLogger(__name__)


class ControlLoop:
    name = "control loop"  # for the thread and the log

    def __init__(self, kubeconfig: str | Path, poll_interval: float):
        self.poll_interval = poll_interval
        configuration = client.Configuration()
        config.load_kube_config(str(kubeconfig), client_configuration=configuration)
        self._api_client = client.ApiClient(configuration)
        self.core = client.CoreV1Api(self._api_client)
        self.storage = client.StorageV1Api(self._api_client)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sync_once(self) -> None:
        raise NotImplementedError

    def start(self):
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self._api_client.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync_once()
            except Exception:  # the API may be going away at shutdown; keep going otherwise
                if self._stop.is_set():
                    break
                logger.exception("%s pass failed", self.name)
            self._stop.wait(self.poll_interval)
