"""``GET .../pods/<name>/log``: what kube-apiserver proxies from the kubelet, read from the local runner's files.

Supports ``follow`` (stream until the container has finished or the pod is gone), ``tailLines``,
``limitBytes`` and ``timestamps=false``. Differs from a real API server: ``previous`` returns the same file
(the runner appends every restart's output to one log), ``sinceSeconds``/``sinceTime`` are ignored, and
``timestamps=true`` is not supported.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp.web

FOLLOW_POLL_S = 0.2
FINISHED = ("Succeeded", "Failed")


def _container_name(pod: dict[str, Any], asked: str | None) -> str:
    names = [c.get("name", "") for c in (pod.get("spec") or {}).get("containers") or []]
    if asked and asked not in names:
        raise LookupError(f'container {asked} is not valid for pod {pod["metadata"]["name"]}')
    return asked or (names[0] if names else "")


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
    data = path.read_bytes()
    if "tailLines" in query:
        data = _tail(data, int(query["tailLines"]))
    limit = int(query["limitBytes"]) if "limitBytes" in query else None
    if limit is not None:
        data = data[:limit]
    follow = query.get("follow") in ("true", "1")
    if not follow:
        return aiohttp.web.Response(body=data, content_type="text/plain")
    response = aiohttp.web.StreamResponse(headers={"Content-Type": "text/plain", "Transfer-Encoding": "chunked"})
    await response.prepare(raw)
    sent = len(data)
    offset = path.stat().st_size
    try:
        await response.write(data)
        while limit is None or sent < limit:
            now = current()  # read before the file, so output written before the exit is never cut off
            done = now is None or now["metadata"].get("uid") != pod["metadata"].get("uid") or \
                (now.get("status") or {}).get("phase") in FINISHED
            size = path.stat().st_size if path.exists() else offset
            if size > offset:
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read(size - offset)
                offset = size
                if limit is not None:
                    chunk = chunk[:limit - sent]
                sent += len(chunk)
                await response.write(chunk)
            if done:
                break
            if size <= offset:
                await asyncio.sleep(FOLLOW_POLL_S)
        await response.write_eof()
    except (ConnectionResetError, asyncio.CancelledError):
        pass  # the client stopped following
    return response
