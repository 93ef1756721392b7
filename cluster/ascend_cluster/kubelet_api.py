"""The node agent's kubelet API: ``GET /containerLogs/<namespace>/<pod>/<container>`` over TLS, which
kube-apiserver calls for ``kubectl logs [-f]`` (``pods/log``) at the port the Node advertises in
``status.daemonEndpoints.kubeletEndpoint``.

The agent serves with a certificate of the cluster's CA for ``127.0.0.1`` (kube-apiserver runs with
``--kubelet-certificate-authority`` and checks it) and accepts only clients with a certificate of the same CA
(kube-apiserver presents ``--kubelet-client-certificate``). Differs from a kubelet: no SubjectAccessReview of the
caller (any certificate of the cluster's CA may read logs), and no exec, attach, port-forward or metrics.
"""
from __future__ import annotations

import re
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from .certificates import KeyPair
from .pod_logs import log_chunks

_LOGS = re.compile(r"^/containerLogs/([^/]+)/([^/]+)/([^/]+)$")
# (namespace, pod, container) -> the log file and "has the container finished?", or None for an unknown pod
LogSource = Callable[[str, str, str], "tuple[Path, Callable[[], bool]] | None"]


class KubeletApi:
    def __init__(self, serving: KeyPair, client_ca: Path, logs: LogSource):
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(serving.cert), str(serving.key))
        context.load_verify_locations(str(client_ca))
        context.verify_mode = ssl.CERT_REQUIRED
        handler = type("Handler", (_Handler,), {"logs": staticmethod(logs)})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name=f"kubelet-api-{self.port}",
                                        daemon=True)

    def start(self) -> KubeletApi:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop answering (a lost node's kubelet is gone with its machine); safe to call twice."""
        if self._thread.is_alive():
            self.server.shutdown()
        self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    logs: LogSource

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass  # kube-apiserver's own log has the request

    def _answer(self, code: int, text: str) -> None:
        body = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        url = urlsplit(self.path)
        match = _LOGS.match(url.path)
        if match is None:
            return self._answer(404, f"404 page not found: {url.path}")
        query = dict(parse_qsl(url.query))
        if query.get("timestamps") in ("true", "1"):
            return self._answer(400, "timestamps are not recorded by the local node agent")
        found = self.logs(*match.groups())
        namespace, pod, container = match.groups()
        if found is None:
            return self._answer(404, f'pod "{pod}" in namespace "{namespace}" is not running on this node')
        path, finished = found
        if not path.exists():
            return self._answer(400, f'container "{container}" in pod "{pod}" is waiting to start: '
                                     "ContainerCreating")
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for chunk in log_chunks(path, query, finished):
                if chunk:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            pass  # the client stopped following
