"""The dashboard's HTTP server: ``/`` the page, ``/api/jobs`` its data (JSON); GET only."""
from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client

from .data import get_object, snapshot
from .page import PAGE

logger = logging.getLogger(__name__)


def _handler(api: client.ApiClient) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = self.path.split("?")[0]
            if path in ("/", "/index.html"):
                self._send(200, "text/html; charset=utf-8", PAGE.encode())
            elif path == "/api/jobs":
                self._json(lambda: snapshot(api))
            elif path.startswith("/api/objects/") and len(path.split("/")) == 6:
                _, _, _, plural, namespace, name = path.split("/")
                self._json(lambda: get_object(api, plural, namespace, name))
            else:
                self._send(404, "text/plain", b"not found\n")

        def _json(self, read) -> None:
            try:
                data = read()
            except Exception as exc:  # the API is away or refuses: the page says so in words and retries
                self._send(503, "application/json", json.dumps(unreachable(exc, api)).encode())
                return
            if data is None:
                self._send(404, "application/json", b'{"error": "no such object"}')
                return
            self._send(200, "application/json", json.dumps(data).encode())

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


def unreachable(exc: Exception, api: client.ApiClient) -> dict[str, str]:
    """A sentence for the page instead of a client library's exception text (kept as ``detail``)."""
    host = api.configuration.host
    status = getattr(exc, "status", None)
    if status in (401, 403):
        error = f"The Kubernetes API at {host} refused the dashboard ({status} {getattr(exc, 'reason', '')})."
    elif status == 404:
        error = f"The Kubernetes API at {host} has no AscendTrainJob kind here: are the CRDs installed?"
    elif status:
        error = f"The Kubernetes API at {host} answered {status} {getattr(exc, 'reason', '')}."
    else:
        error = (f"Cannot reach the Kubernetes API at {host}: is the cluster running? "
                 "(local: `ascend-train local up`)")
    return {"error": error, "detail": str(exc)[:500]}


def serve(api: client.ApiClient, port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Serve in a daemon thread; ``shutdown()`` on the returned server stops it."""
    server = ThreadingHTTPServer((host, port), _handler(api))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="dashboard", daemon=True).start()
    return server
