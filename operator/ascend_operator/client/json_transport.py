"""The operator's plain request/response calls (every create, patch, get, list and delete) over keep-alive
HTTP/1.1 connections of its own, with the kubeconfig's or the pod's server, TLS settings and credentials.

The Kubernetes client sends through urllib3's pool manager and reads each answer with http.client, which parses
the headers with the email package: about 1 ms of CPU a request, two thirds of the operator's CPU while it
creates the Service, ConfigMap, pods and Event of hundreds of new jobs. A request here is one ``sendall`` of the
head and body and a read of the status line, the headers it needs (``Content-Length``, ``Transfer-Encoding``,
``Connection``) and the body. Watches stream and keep the client's path (``Kube.request``), as do API servers
reached through a proxy.

A pooled connection the server has closed since its last use (an idle timeout) fails on the next send or
answers with nothing; the request is then sent once more on a new connection, as Go's and urllib3's transports
do, and only when no byte of an answer had arrived.
"""
from __future__ import annotations

import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

MAX_LINE = 65536  # longest status or header line accepted, as http.client's limit
MAX_HEADERS = 100


class ProtocolError(ConnectionError):
    """The server's answer is not HTTP/1.x as this client reads it."""


@dataclass(frozen=True)
class Answer:
    status: int
    reason: str
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    body: bytes


class _Stale(ConnectionError):
    """A reused connection was closed by the server before any byte of the answer: safe to send again."""


class _Connection:
    def __init__(self, transport: "JsonTransport") -> None:
        t = transport
        sock = socket.create_connection((t.host, t.port), timeout=t.connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if t.tls is not None:
            sock = t.tls.wrap_socket(sock, server_hostname=t.server_name)
        sock.settimeout(t.read_timeout)
        self.sock, self.reader, self.used = sock, sock.makefile("rb"), False

    def close(self) -> None:
        self.reader.close()
        self.sock.close()

    def exchange(self, head: bytes, body: bytes | None, method: str) -> tuple[Answer, bool]:
        """Send one request, read its answer: (answer, whether the connection can carry another)."""
        reused = self.used
        self.used = True
        try:
            self.sock.sendall(head + body if body else head)
            status_line = self.reader.readline(MAX_LINE + 1)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError) as e:
            if reused:
                raise _Stale() from e
            raise
        if not status_line:
            if reused:
                raise _Stale()
            raise ProtocolError("the server closed the connection without an answer")
        version, status, reason = _status(status_line)
        headers: dict[str, str] = {}
        for _ in range(MAX_HEADERS + 1):
            line = self.reader.readline(MAX_LINE + 1)
            if line in (b"\r\n", b"\n"):
                break
            if not line or len(line) > MAX_LINE or b":" not in line:
                raise ProtocolError(f"malformed header line {line[:80]!r}")
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        else:
            raise ProtocolError(f"more than {MAX_HEADERS} headers")
        keep = version != "HTTP/1.0" and "close" not in headers.get("connection", "").lower()
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            data = b""
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            data = self._chunks()
        elif "content-length" in headers:
            length = int(headers["content-length"])
            data = self.reader.read(length)
            if len(data) != length:
                raise ProtocolError(f"the answer ended after {len(data)} of {length} bytes")
        else:  # delimited by the end of the connection
            data, keep = self.reader.read(), False
        return Answer(status, reason, headers, data), keep

    def _chunks(self) -> bytes:
        parts = []
        while True:
            size_line = self.reader.readline(MAX_LINE + 1)
            try:
                size = int(size_line.split(b";", 1)[0], 16)
            except ValueError:
                raise ProtocolError(f"malformed chunk size {size_line[:80]!r}") from None
            if size == 0:
                while self.reader.readline(MAX_LINE + 1) not in (b"\r\n", b"\n", b""):  # trailers
                    pass
                return b"".join(parts)
            chunk = self.reader.read(size)
            if len(chunk) != size or self.reader.readline(MAX_LINE + 1) not in (b"\r\n", b"\n"):
                raise ProtocolError("a chunk ended early")
            parts.append(chunk)


def _status(line: bytes) -> tuple[str, int, str]:
    parts = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ProtocolError(f"malformed status line {line[:80]!r}")
    return parts[0], int(parts[1]), parts[2] if len(parts) > 2 else ""


def tls_context(configuration: Any) -> ssl.SSLContext:
    """The TLS settings of a kubernetes-client ``Configuration`` (CA, client certificate, verification)."""
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if not configuration.verify_ssl:
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    elif configuration.assert_hostname is False:
        context.check_hostname = False
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    return context


class JsonTransport:
    """Requests to one API server over a small pool of keep-alive connections (one per concurrent caller)."""

    def __init__(self, configuration: Any, timeout: tuple[float, float]) -> None:
        url = urlsplit(configuration.host)
        if url.scheme not in ("http", "https"):
            raise ValueError(f"API server URL {configuration.host!r}: http or https expected")
        self.host = url.hostname or "localhost"
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.base = url.path.rstrip("/")
        self.host_header = url.netloc.rsplit("@", 1)[-1]
        self.tls = tls_context(configuration) if url.scheme == "https" else None
        self.server_name = getattr(configuration, "tls_server_name", None) or \
            (configuration.assert_hostname if isinstance(configuration.assert_hostname, str) else self.host)
        self.connect_timeout, self.read_timeout = timeout
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()

    def call(self, method: str, target: str, headers: dict[str, str], body: bytes | None) -> Answer:
        """One request (``target`` is the path and query below the server's URL); the whole answer."""
        if any("\r" in text or "\n" in text or (text is target and " " in text)
               for text in (target, *headers, *headers.values())):
            raise ValueError(f"{method} {target!r}: a line break (or a space in the path) would split the request")
        lines = [f"{method} {self.base}{target} HTTP/1.1", f"Host: {self.host_header}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        connection = self._take()
        for fresh in (False, True):
            if fresh:  # the pooled one was stale; the others may be too
                connection = _Connection(self)
            try:
                answer, keep = connection.exchange(head, body, method)
            except _Stale:
                connection.close()
                continue
            except BaseException:
                connection.close()
                raise
            if keep:
                with self._lock:
                    self._idle.append(connection)
            else:
                connection.close()
            return answer
        raise ProtocolError("the server closed two connections in a row without an answer")

    def _take(self) -> _Connection:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return _Connection(self)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
