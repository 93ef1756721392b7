"""The local cluster's servers get ports that outgoing connections cannot take before they bind."""
from __future__ import annotations

import socket

from ascend_cluster.processes import _ephemeral_start, free_port


def test_free_ports_lie_below_the_kernels_ephemeral_range_and_are_free():
    ports = {free_port() for _ in range(20)}
    assert all(port < _ephemeral_start() for port in ports)
    assert len(ports) > 1  # drawn, not one fixed port
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
