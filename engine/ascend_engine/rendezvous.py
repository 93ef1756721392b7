"""``ascend-engine wait-for-master [--addr A --port P --timeout S] -- torchrun ...``

Pods other than pod 0 run this before torchrun: it waits until the master's DNS name resolves and its port
accepts a connection, then replaces itself with the command after ``--``. A worker that starts before pod 0
(still scheduling, pulling its image, or restarting) therefore waits instead of failing on a name that does not
resolve yet. When the time runs out it exits 124 with a report naming the address, which the operator turns
into a MasterUnreachable condition.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import time

from .telemetry import report_result

MASTER_UNREACHABLE_EXIT = 124  # as timeout(1); the operator's RunPolicy knows this code


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--addr", default=os.environ.get("MASTER_ADDR"), help="master address (default $MASTER_ADDR)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("MASTER_PORT", "29500")),
                        help="master port (default $MASTER_PORT)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait before giving up")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between attempts")
    parser.add_argument("then", nargs=argparse.REMAINDER, metavar="COMMAND", help="-- then the command to run once the master answers")


def reachable(addr: str, port: int, timeout: float) -> str | None:
    """None when ``addr:port`` accepts a TCP connection, else what stood in the way."""
    try:
        infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        return f"{addr} does not resolve ({e.strerror})"
    last = "no address"
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.settimeout(timeout)
                s.connect(sockaddr)
                return None
        except OSError as e:
            last = f"{addr}:{port} refuses connections ({e.strerror or e})"
    return last


def wait(addr: str, port: int, timeout: float, interval: float) -> str | None:
    """Poll until reachable; None on success, the last obstacle when ``timeout`` runs out."""
    deadline = time.monotonic() + timeout
    while True:
        obstacle = reachable(addr, port, min(interval, 5.0))
        if obstacle is None or time.monotonic() >= deadline:
            return obstacle
        time.sleep(interval)


def run(args: argparse.Namespace) -> int:
    command = args.then[1:] if args.then[:1] == ["--"] else args.then
    if not args.addr:
        print("wait-for-master: no --addr and no MASTER_ADDR", file=sys.stderr)
        return 2
    start = time.monotonic()
    obstacle = wait(args.addr, args.port, args.timeout, args.interval)
    if obstacle is not None:
        message = f"master {args.addr}:{args.port} not reachable after {args.timeout:g}s: {obstacle}"
        print(f"wait-for-master: {message}", file=sys.stderr)
        report_result({"status": "Failed", "reason": "MasterUnreachable", "message": message})
        return MASTER_UNREACHABLE_EXIT
    print(f"wait-for-master: {args.addr}:{args.port} answered after {time.monotonic() - start:.1f}s",
          file=sys.stderr, flush=True)
    if not command:
        return 0
    os.execvp(command[0], command)
    return 0  # not reached: execvp replaces this process
