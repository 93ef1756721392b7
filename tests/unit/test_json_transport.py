"""The operator's own HTTP/1.1 transport against Python's HTTP server: keep-alive reuse, both ways a body is
delimited, a pooled connection the server has dropped, errors as ApiException with the server's Status, and TLS
verified against the kubeconfig's CA."""
from __future__ import annotations

import http.server
import json
import shutil
import ssl
import subprocess
import threading

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from ascend_operator.client.json_transport import JsonTransport
from ascend_operator import metrics
from ascend_operator.client.kubeclient import Kube, _retrying


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    connections: list[int] = []  # the client port of the connection that served each request (an id() may be reused)

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).connections.append(self.client_address[1])
        if self.path.startswith("/chunked"):
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b'{"items": [', b"1, 2", b"]}"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
            return
        if self.path.startswith("/missing"):
            self._send(404, {"kind": "Status", "message": 'pods "x" not found', "reason": "NotFound"})
            return
        self._send(200, {"path": self.path, "auth": self.headers.get("Authorization")})
        if self.path.startswith("/then-drop"):  # an idle timeout: closed without saying so in the answer
            self.close_connection = True

    def do_POST(self) -> None:  # noqa: N802
        type(self).connections.append(self.client_address[1])
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self._send(201, {"got": body, "type": self.headers["Content-Type"]})

    def _send(self, code: int, doc: dict) -> None:
        data = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server():
    _Handler.connections = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _kube(host: str, **settings: object) -> Kube:
    """A Kube on an explicit configuration (as the kubeconfig loader would fill it)."""
    conf = client.Configuration(host=host)
    conf.api_key = {"BearerToken": "t0ken"}
    conf.api_key_prefix = {"BearerToken": "Bearer"}
    for key, value in settings.items():
        setattr(conf, key, value)
    client.Configuration.set_default(conf)
    try:
        kube = Kube.__new__(Kube)
        kube.api = client.ApiClient(conf)
        kube._transport = JsonTransport(conf, (5.0, 10.0))
        return kube
    finally:
        client.Configuration.set_default(None)


def test_requests_share_a_connection_and_bodies_arrive_whole(server):
    kube = _kube(f"http://127.0.0.1:{server.server_port}")
    assert kube._json("GET", "/api/v1/pods", query={"labelSelector": "a=b", "limit": None}) == \
        {"path": "/api/v1/pods?labelSelector=a%3Db", "auth": "Bearer t0ken"}
    assert kube._json("POST", "/api/v1/namespaces/d/pods", {"kind": "Pod", "name": "ü"}) == \
        {"got": {"kind": "Pod", "name": "ü"}, "type": "application/json"}
    assert kube._json("GET", "/chunked") == {"items": [1, 2]}
    assert len(_Handler.connections) == 3 and len(set(_Handler.connections)) == 1  # one keep-alive connection


def test_a_connection_the_server_dropped_is_replaced_and_the_request_sent_again(server):
    kube = _kube(f"http://127.0.0.1:{server.server_port}")
    kube._json("GET", "/then-drop")
    assert kube._json("GET", "/after") == {"path": "/after", "auth": "Bearer t0ken"}
    assert len(set(_Handler.connections)) == 2


def test_an_error_answer_raises_api_exception_with_the_status_message(server):
    kube = _kube(f"http://127.0.0.1:{server.server_port}")
    with pytest.raises(ApiException) as refused:
        kube._json("GET", "/missing")
    assert refused.value.status == 404 and refused.value.reason == "Not Found"
    assert json.loads(refused.value.body)["message"] == 'pods "x" not found'
    counted = metrics.API_ERRORS.labels("404")._value.get()
    assert kube._get("/missing") is None  # an answer (there is none), not a failed call
    assert metrics.API_ERRORS.labels("404")._value.get() == counted
    with pytest.raises(ApiException):
        _retrying(lambda: kube._json("GET", "/missing"))  # a 404 the caller did not ask about is counted
    assert metrics.API_ERRORS.labels("404")._value.get() == counted + 1
    assert kube._json("GET", "/still") == {"path": "/still", "auth": "Bearer t0ken"}  # the connection goes on
    with pytest.raises(ValueError, match="line break"):  # no header smuggled into the request
        kube._transport.call("GET", "/x", {"User-Agent": "a\r\nX-Injected: 1"}, None)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_tls_is_verified_against_the_configured_ca(server, tmp_path):
    cert, key = tmp_path / "ca.crt", tmp_path / "ca.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=api",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    url = f"https://127.0.0.1:{server.server_port}"
    assert _kube(url, ssl_ca_cert=str(cert))._json("GET", "/secure")["path"] == "/secure"
    with pytest.raises(ssl.SSLCertVerificationError):
        _kube(url)._json("GET", "/secure")  # the system's CAs do not know this server
    assert _kube(url, verify_ssl=False)._json("GET", "/insecure")["path"] == "/insecure"
