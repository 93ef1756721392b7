"""A control-plane component as a child process: started with its log file, asked to stop, killed if it won't, and
told to stop by the kernel if the process that started it dies first (a test run killed mid-way would otherwise
leave etcd, kube-apiserver and the controllers running)."""
from __future__ import annotations

import ctypes
import os
import random
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


_LOWEST_PORT = 10000


def _ephemeral_start() -> int:
    """The first port the kernel hands to outgoing connections (Linux's ``ip_local_port_range``)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port free now, for a server started a moment later. Drawn below the kernel's ephemeral range:
    a port the kernel picks (bind to 0) is one it also gives outgoing connections, and a component connecting
    to kube-apiserver took one between this check and kube-scheduler's bind ("address already in use", a
    clean clone's test run). Drawn with the system's randomness, so processes that seed ``random`` alike do not
    draw alike; the kernel's pick where no port below the range is free."""
    top = _ephemeral_start() - 1
    if top > _LOWEST_PORT:
        draw = random.SystemRandom()
        for _ in range(64):
            port = draw.randint(_LOWEST_PORT, top)
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
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
