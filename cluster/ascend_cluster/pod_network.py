"""Per-pod networks on one host: each local cluster owns a loopback /16, and each pod's wildcard binds go to
the pod's own IP.

On a real node every pod has its own network namespace, so two pods (or two clusters) can both listen on
``*:29500``. Local pods are host processes sharing one namespace, which breaks that: torchrun's rendezvous
store (a C++ ``TCPStore``) always listens on the wildcard address, so a second job or a second cluster on the
same host failed with EADDRINUSE. Two pieces give each pod the isolation a namespace would:

- ``claim_network``: a cluster takes a free ``127.<n>.0.0/16`` (held by an advisory lock for the life of the
  process, so concurrent clusters, test runs and ``ascend-train local up`` never share pod IPs);
- ``bind_shim``: a tiny ``LD_PRELOAD`` library, compiled once with the host's C compiler, that rewrites a
  ``bind`` to ``0.0.0.0`` / ``::`` into a bind to the pod's IP (``ASCEND_LOCAL_POD_IP``). Explicit addresses
  and ephemeral ports are left as they are.

Differs from a namespace: ``localhost`` inside a pod is still the host's, so a server a pod bound through the
wildcard is reached at the pod's IP, not at ``127.0.0.1``. Statically linked programs are not covered by the shim.
A process outside the local clusters that listens on the wildcard itself (a torchrun started by hand on
``*:29500``) still takes that port from every pod: the kernel refuses a specific address on a port the
wildcard holds.
Without a C compiler the runner logs a warning and pods share the host's ports as before.
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import IO

logger = logging.getLogger(__name__)

POD_IP_ENV = "ASCEND_LOCAL_POD_IP"
FIRST_NETWORK, LAST_NETWORK = 1, 254  # 127.1.0.0/16 ... 127.254.0.0/16; 127.0.x.x stays the host's

_SHIM_SOURCE = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

/* A bind to the wildcard address becomes a bind to the pod's own loopback IP. */
int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real_bind;
    if (!real_bind) real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    const char *ip = getenv("ASCEND_LOCAL_POD_IP");
    struct in_addr pod;
    if (!ip || !addr || inet_pton(AF_INET, ip, &pod) != 1) return real_bind(fd, addr, len);
    if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in a;
        memcpy(&a, addr, sizeof a);
        if (a.sin_addr.s_addr == htonl(INADDR_ANY)) {
            a.sin_addr = pod;
            return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
        }
    } else if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 a;
        memcpy(&a, addr, sizeof a);
        if (IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr)) {
            memset(&a.sin6_addr, 0, sizeof a.sin6_addr);
            a.sin6_addr.s6_addr[10] = 0xff;
            a.sin6_addr.s6_addr[11] = 0xff;
            memcpy(&a.sin6_addr.s6_addr[12], &pod, 4);
            int rc = real_bind(fd, (const struct sockaddr *)&a, sizeof a);
            if (rc == 0 || errno != EINVAL) return rc;  /* EINVAL: an IPV6_V6ONLY socket, bind it as asked */
        }
    }
    return real_bind(fd, addr, len);
}
"""


def _lock_dir() -> Path:
    path = Path(tempfile.gettempdir()) / "ascend-local-networks"
    path.mkdir(mode=0o1777, exist_ok=True)
    return path


class PodNetwork:
    """The loopback /16 a cluster owns while this object lives (``close`` gives it back)."""

    def __init__(self, index: int, lock: IO[bytes]):
        self.index = index
        self._lock = lock

    @property
    def prefix(self) -> str:
        return f"127.{self.index}"

    def close(self) -> None:
        if not self._lock.closed:
            self._lock.close()  # closing the file releases the flock


def claim_network() -> PodNetwork:
    """Take the first loopback /16 that no other live cluster on this host holds."""
    for index in range(FIRST_NETWORK, LAST_NETWORK + 1):
        lock = open(_lock_dir() / f"127.{index}.lock", "ab")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        return PodNetwork(index, lock)
    raise RuntimeError(f"all {LAST_NETWORK} loopback networks are held by running local clusters")


def bind_shim(cache_dir: Path) -> Path | None:
    """The compiled ``LD_PRELOAD`` library (built once per source version), or None without a C compiler."""
    digest = hashlib.sha256(_SHIM_SOURCE.encode()).hexdigest()[:12]
    library = cache_dir / f"pod-bind-{digest}.so"
    if library.exists():
        return library
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        logger.warning("no C compiler (cc/gcc): local pods share the host's ports, so two jobs or clusters "
                       "that listen on the same port will clash")
        return None
    cache_dir.mkdir(parents=True, exist_ok=True)
    source = cache_dir / f"pod-bind-{digest}.c"
    source.write_text(_SHIM_SOURCE)
    partial = library.with_suffix(f".{os.getpid()}.tmp")
    result = subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(partial), str(source), "-ldl"],
                            capture_output=True, text=True)
    if result.returncode != 0:
        logger.warning("could not build the local pod network shim (%s): local pods share the host's ports\n%s",
                       compiler, result.stderr[-2000:])
        return None
    partial.replace(library)
    return library
