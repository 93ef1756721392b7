"""A container's log as the node agent's kubelet API serves it (``kubelet_api``), and as ``ascend-train logs`` reads it.

Supports ``follow`` (stream until the container has finished or the pod is gone), ``tailLines`` and
``limitBytes``. Differs from a kubelet: ``previous`` returns the same file (the agent appends every restart's
output to one log), ``sinceSeconds``/``sinceTime`` are ignored, and ``timestamps=true`` is refused.

Paths read as the container's (``pod_environment.ContainerPathView``): the runner starts the process with host
paths, and this is where they turn back into ``/workspace/...``, for the API's log, ``ascend-train logs`` and
the SDK alike. While following, a line is rewritten once it is complete, or when the pod has written nothing
more for a poll (a progress line without a newline is not held back).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

from .pod_environment import ContainerPathView

FOLLOW_POLL_S = 0.2


class FollowedLog:
    """Chunks of a growing log in, container-path lines out; a partial last line waits for its end or ``flush``."""

    def __init__(self, view: ContainerPathView):
        self.view = view
        self._partial = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._partial + chunk
        cut = data.rfind(b"\n") + 1
        self._partial = data[cut:]
        return self.view.bytes(data[:cut])

    def flush(self) -> bytes:
        data, self._partial = self._partial, b""
        return self.view.bytes(data)


def read_container_log(log: Path) -> bytes:
    """The whole log at ``log`` (in its pod's directory), as the container would have printed it."""
    return ContainerPathView.of_pod(log.parent).bytes(log.read_bytes()) if log.exists() else b""


def _tail(data: bytes, lines: int) -> bytes:
    if lines <= 0:
        return b""
    parts = data.splitlines(keepends=True)
    return b"".join(parts[-lines:])


def log_chunks(path: Path, query: dict[str, str], finished: Callable[[], bool]) -> Iterator[bytes]:
    """The container log at ``path`` as a kubelet's ``/containerLogs`` answers it: ``tailLines``, ``limitBytes``,
    and with ``follow`` the lines written later, until ``finished()`` (the container ended, or the pod is gone)."""
    offset = path.stat().st_size
    with open(path, "rb") as f:
        data = f.read(offset)
    followed = FollowedLog(ContainerPathView.of_pod(path.parent))
    follow = query.get("follow") in ("true", "1")
    data = followed.feed(data) + (b"" if follow else followed.flush())
    if "tailLines" in query:
        data = _tail(data, int(query["tailLines"]))
    limit = int(query["limitBytes"]) if "limitBytes" in query else None
    if limit is not None:
        data = data[:limit]
    sent = len(data)
    yield data
    while follow and (limit is None or sent < limit):
        done = finished()  # asked before the file is read, so output written before the exit is never cut off
        size = path.stat().st_size if path.exists() else offset
        grew = size > offset
        chunk = b""
        if grew:
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = followed.feed(f.read(size - offset))
            offset = size
        if done or not grew:  # a quiet poll: the partial line is shown as it is
            chunk += followed.flush()
        if chunk:
            if limit is not None:
                chunk = chunk[:limit - sent]
            sent += len(chunk)
            yield chunk
        if done:
            return
        if not grew:
            time.sleep(FOLLOW_POLL_S)
