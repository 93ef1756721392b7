"""A control-plane component as a child process: started with its log file, asked to stop, killed if it won't, and
told to stop by the kernel if the process that started it dies first (a test run killed mid-way would otherwise
leave etcd, kube-apiserver and the controllers running)."""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def stop_with_parent() -> None:
    """In the child, before exec: SIGKILL when the parent exits (Linux's parent-death signal). Not SIGTERM: a
    kube-apiserver whose etcd went first waits for it forever; etcd is crash-safe unless run without fsync (tests)."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Component:
    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None):
        self.name, self.argv, self.log_path = name, argv, log
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Component:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=self.env, start_new_session=True, preexec_fn=stop_with_parent)
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def died_because(self) -> str:
        """The exit code and the tail of the log, for an error message."""
        code = self.process.poll() if self.process else None
        tail = self.log_path.read_text(errors="replace").splitlines()[-15:] if self.log_path.exists() else []
        return f"{self.name} exited with code {code}; the end of {self.log_path}:\n  " + "\n  ".join(tail)

    def stop(self, grace_s: float = 10.0) -> None:
        if not self.alive():
            return
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
