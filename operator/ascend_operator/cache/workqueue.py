"""A work queue of job keys served by a shared pool of worker threads, with client-go's workqueue semantics.

kopf calls a handler per watch event; a gang restart of a 4096-node job is tens of thousands of pod events. The
handlers only ``add`` the job's key here, and the workers reconcile each key:

- **coalescing**: a key already waiting is not queued twice, so a burst of events for one job costs one
  reconcile (or two, when events keep coming while the first runs);
- **one worker per key**: a key added while a worker reconciles it is marked dirty and queued again when that
  worker is ``done``, so a job is never reconciled twice at once and no event is lost;
- **fairness**: keys are served first in, first out from one queue shared by every job, so a job whose pods
  storm the queue holds at most one worker and one place in line; a new small job waits behind at most one
  reconcile per other queued job, never behind the storm.
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Hashable

logger = logging.getLogger(__name__)


class WorkQueue:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: deque[Hashable] = deque()
        self._dirty: set[Hashable] = set()  # waiting to be processed (in _queue, or re-queued on done)
        self._processing: set[Hashable] = set()
        self._shutting_down = False

    def add(self, key: Hashable) -> None:
        with self._cond:
            if self._shutting_down or key in self._dirty:
                return
            self._dirty.add(key)
            if key not in self._processing:
                self._queue.append(key)
                self._cond.notify()

    def get(self, timeout: float | None = None) -> Hashable | None:
        """The next key to process (the caller owns it until ``done``), or None on shutdown or timeout."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._queue or self._shutting_down, timeout):
                return None
            if not self._queue:
                return None
            key = self._queue.popleft()
            self._dirty.discard(key)
            self._processing.add(key)
            return key

    def done(self, key: Hashable) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._queue.append(key)
                self._cond.notify()

    def shut_down(self) -> None:
        with self._cond:
            self._shutting_down = True
            self._queue.clear()
            self._dirty.clear()
            self._cond.notify_all()

    @property
    def accepting(self) -> bool:
        return not self._shutting_down

    def __len__(self) -> int:
        with self._cond:
            return len(self._queue)

    def unfinished(self) -> int:
        """Keys waiting or being processed: client-go's workqueue depth plus the work in flight."""
        with self._cond:
            return len(self._dirty | self._processing)


class Workers:
    """``count`` threads that take keys from ``queue`` and call ``process(key)``; a failure is logged, the key
    is not retried at once (the periodic sweep queues every live job again)."""

    def __init__(self, queue: WorkQueue, process: Callable[[Hashable], None], count: int) -> None:
        self.queue, self._process = queue, process
        self._threads = [threading.Thread(target=self._work, name=f"reconcile-{i}", daemon=True)
                         for i in range(count)]

    def start(self) -> Workers:
        for t in self._threads:
            t.start()
        return self

    def _work(self) -> None:
        while True:
            key = self.queue.get()
            if key is None:
                return
            try:
                self._process(key)
            except Exception:  # noqa: BLE001 - one job's failure must not stop the worker
                logger.exception("reconciling %s failed", key)
            finally:
                self.queue.done(key)

    def stop(self, timeout: float = 30) -> None:
        self.queue.shut_down()
        for t in self._threads:
            t.join(timeout)
