"""The operator's probes: ``/healthz`` (liveness) and ``/readyz`` (readiness), which answer different questions.

* live: the process's control loop is turning (the leader-election loop tried the API recently, or kopf runs);
  a failing liveness probe restarts the container, so a standby that merely waits is still live;
* ready: a leader is ready once its first watch on the custom resources has been answered by the API server
  (handlers will see events) and every informer has listed its objects (a reconcile reads a whole cache); a
  standby is ready once it has read or written the Lease (it can take over), so a rolling update of a 2-replica
  Deployment can progress while it stands by.

Served on a plain thread, because standbys run before (and without) kopf's event loop.
"""
from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

logger = logging.getLogger(__name__)


class Probes:
    """What the endpoints report; the checks are callables so each answer is computed when asked."""

    def __init__(self, live: Callable[[], bool], ready: Callable[[], bool]):
        self.live, self.ready = live, ready

    def serve(self, host: str, port: int) -> ThreadingHTTPServer:
        probes = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                checks = {"/healthz": probes.live, "/livez": probes.live, "/readyz": probes.ready}
                check = checks.get(self.path.split("?")[0])
                if check is None:
                    self.send_error(404)
                    return
                ok = bool(check())
                body = b"ok" if ok else b"not ok"
                self.send_response(200 if ok else 503)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:  # probes every few seconds: not worth a log line
                pass

        server = ThreadingHTTPServer((host, port), Handler)
        threading.Thread(target=server.serve_forever, name="probes", daemon=True).start()
        logger.info("probes on http://%s:%s/healthz and /readyz", host, server.server_address[1])
        return server


def first_watch_answered(watch: Callable[[], None], stop: threading.Event, done: threading.Event,
                         retry_s: float = 1.0) -> None:
    """Call ``watch`` (one short watch request) until it succeeds, then set ``done``."""
    while not stop.is_set():
        try:
            watch()
            done.set()
            return
        except Exception as e:
            logger.warning("readiness: watch not answered yet: %s", e)
            stop.wait(retry_s)
