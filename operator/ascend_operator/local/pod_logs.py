"""``GET .../pods/<name>/log``: what kube-apiserver proxies from the kubelet, read from the local runner's files.

Supports ``follow`` (stream until the container has finished or the pod is gone), ``tailLines``,
``limitBytes`` and ``timestamps=false``. Differs from a real API server: ``previous`` returns the same file
(the runner appends every restart's output to one log), ``sinceSeconds``/``sinceTime`` are ignored, and
``timestamps=true`` is not supported.

Paths read as the container's (``pod_environment.ContainerPathView``): the runner starts the process with host
paths, and this is where they turn back into ``/workspace/...``, for the API's log, ``ascend-train logs`` and
the SDK alike. While following, a line is rewritten once it is complete, or when the pod has written nothing
more for a poll (a progress line without a newline is not held back).
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp.web

from .pod_environment import ContainerPathView

FOLLOW_POLL_S = 0.2
FINISHED = ("Succeeded", "Failed")


def _container_name(pod: dict[str, Any], asked: str | None) -> str:
    names = [c.get("name", "") for c in (pod.get("spec") or {}).get("containers") or []]
    if asked and asked not in names:
        raise LookupError(f'container {asked} is not valid for pod {pod["metadata"]["name"]}')
    return asked or (names[0] if names else "")


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


async def serve_log(raw: aiohttp.web.BaseRequest, pod: dict[str, Any], path: Path,
                    current: Callable[[], dict[str, Any] | None]) -> aiohttp.web.StreamResponse:
    """The log of ``pod``'s container at ``path``; ``current()`` re-reads the pod while following."""
    query = raw.query
    container = _container_name(pod, query.get("container"))  # LookupError: the caller answers 400
    if not path.exists():
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        raise FileNotFoundError(f'container "{container}" in pod "{pod["metadata"]["name"]}" is waiting to '
                                f"start: {'ContainerCreating' if phase == 'Pending' else phase}")
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
    if not follow:
        return aiohttp.web.Response(body=data, content_type="text/plain")
    response = aiohttp.web.StreamResponse(headers={"Content-Type": "text/plain", "Transfer-Encoding": "chunked"})
    await response.prepare(raw)
    sent = len(data)
    try:
        await response.write(data)
        while limit is None or sent < limit:
            now = current()  # read before the file, so output written before the exit is never cut off
            done = now is None or now["metadata"].get("uid") != pod["metadata"].get("uid") or \
                (now.get("status") or {}).get("phase") in FINISHED
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
                await response.write(chunk)
            if done:
                break
            if not grew:
                await asyncio.sleep(FOLLOW_POLL_S)
        await response.write_eof()
    except (ConnectionResetError, asyncio.CancelledError):
        pass  # the client stopped following
    return response
