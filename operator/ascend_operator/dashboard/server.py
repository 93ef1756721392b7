"""The dashboard's HTTP server: ``/`` the page, ``/api/jobs`` its data (JSON); GET only."""
from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client

from .data import snapshot
from .page import PAGE

logger = logging.getLogger(__name__)


def _handler(api: client.ApiClient) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = self.path.split("?")[0]
            if path in ("/", "/index.html"):
                self._send(200, "text/html; charset=utf-8", PAGE.encode())
            elif path == "/api/jobs":
                try:
                    body = json.dumps(snapshot(api)).encode()
                except Exception as exc:  # the API is away: the page says so and retries
                    self._send(503, "application/json", json.dumps({"error": str(exc)[:500]}).encode())
                    return
                self._send(200, "application/json", body)
            else:
                self._send(404, "text/plain", b"not found\n")

        def _send(self, code: int, kind: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args: Any) -> None:
            logger.debug("dashboard: " + fmt, *args)

    return Handler


def serve(api: client.ApiClient, port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Serve in a daemon thread; ``shutdown()`` on the returned server stops it."""
    server = ThreadingHTTPServer((host, port), _handler(api))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="dashboard", daemon=True).start()
    return server
