"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's semantics (what controller-runtime uses).

One replica holds the Lease and runs the kopf handlers; the others stand by and retry every ``retry_period``.
The rules, as in client-go's ``leaderelection.tryAcquireOrRenew``:

* a missing Lease is created with ``holderIdentity`` = this replica (``leaseTransitions`` 0);
* a Lease held by someone else is left alone until it has not changed for ``leaseDurationSeconds`` as measured
  on *this* replica's clock since it last saw the record change (so clock skew between nodes does not matter);
* taking over, or renewing, is a PUT carrying the ``resourceVersion`` that was read: when two replicas race,
  the API server answers 409 Conflict to the slower one, which stays a standby;
* a new holder bumps ``leaseTransitions`` and sets ``acquireTime``; the holder renews ``renewTime`` every
  ``retry_period`` and, when it could not renew for ``renew_deadline``, stops leading (the process exits, as a
  controller-runtime manager does, and the Deployment restarts it as a standby);
* a holder that shuts down cleanly releases the Lease (empty holder, duration 1 s) so a standby takes over at once.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from kubernetes import client
from kubernetes.client.rest import ApiException

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseTimings:
    """client-go / controller-runtime defaults: 15 s lease, 10 s renew deadline, 2 s between tries."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not self.lease_duration > self.renew_deadline > self.retry_period > 0:
            raise ValueError(f"leader election needs leaseDuration > renewDeadline > retryPeriod > 0, got "
                             f"{self.lease_duration} / {self.renew_deadline} / {self.retry_period}")


def micro_time() -> str:
    """A ``MicroTime`` as the API server writes it (RFC 3339 with microseconds)."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Acquires and renews one Lease for one identity; the loops run in the caller's thread."""

    def __init__(self, coordination: client.CoordinationV1Api, namespace: str, name: str, identity: str,
                 timings: LeaseTimings = LeaseTimings(), clock: Callable[[], float] = time.monotonic):
        self.api, self.namespace, self.name, self.identity = coordination, namespace, name, identity
        self.timings, self.clock = timings, clock
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._observed_spec: dict[str, Any] = {}
        self.reached_api = threading.Event()  # set after the first successful read or write of the Lease
        self.leading = threading.Event()
        self.last_attempt = clock()

    # -- one round -------------------------------------------------------------------------------

    def _observe(self, spec: dict[str, Any]) -> None:
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseTransitions"),
                  spec.get("leaseDurationSeconds"))
        if record != self._observed:
            self._observed, self._observed_at, self._observed_spec = record, self.clock(), spec

    def _held_by_other(self, spec: dict[str, Any]) -> bool:
        holder = spec.get("holderIdentity") or ""
        if not holder or holder == self.identity:
            return False
        duration = spec.get("leaseDurationSeconds") or self.timings.lease_duration
        return self.clock() < self._observed_at + duration

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this identity holds the Lease afterwards."""
        self.last_attempt = self.clock()
        timeout = self.timings.retry_period
        now = micro_time()
        mine = {"holderIdentity": self.identity, "leaseDurationSeconds": round(self.timings.lease_duration),
                "acquireTime": now, "renewTime": now, "leaseTransitions": 0}
        try:
            raw = self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False,
                                                 _request_timeout=timeout)
            lease = json.loads(raw.data)
        except ApiException as e:
            if e.status != 404:
                logger.warning("leader election: reading Lease %s/%s failed: %s %s", self.namespace, self.name,
                               e.status, e.reason)
                return False
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace}, "spec": mine}
            return self._write(lambda: self.api.create_namespaced_lease(self.namespace, body,
                                                                        _request_timeout=timeout), mine)
        except Exception as e:  # connection refused, timeout: the API is unreachable this round
            logger.warning("leader election: API unreachable: %s", e)
            return False
        self.reached_api.set()
        spec = lease.get("spec") or {}
        self._observe(spec)
        if self._held_by_other(spec):
            return False
        if spec.get("holderIdentity") == self.identity:
            mine.update(acquireTime=spec.get("acquireTime") or now, leaseTransitions=spec.get("leaseTransitions", 0))
        else:
            mine["leaseTransitions"] = (spec.get("leaseTransitions") or 0) + 1
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": lease["metadata"],
                "spec": mine}  # metadata carries resourceVersion: a concurrent writer makes this a 409
        return self._write(lambda: self.api.replace_namespaced_lease(self.name, self.namespace, body,
                                                                     _request_timeout=timeout), mine)

    def _write(self, call: Callable[[], Any], spec: dict[str, Any]) -> bool:
        try:
            call()
        except ApiException as e:
            if e.status != 409:
                logger.warning("leader election: writing Lease %s/%s failed: %s %s", self.namespace, self.name,
                               e.status, e.reason)
            return False  # 409: another replica wrote first
        except Exception as e:
            logger.warning("leader election: API unreachable: %s", e)
            return False
        self.reached_api.set()
        self._observe(spec)
        return True

    # -- loops -----------------------------------------------------------------------------------

    def _pause(self, stop: threading.Event) -> None:
        stop.wait(self.timings.retry_period * random.uniform(1.0, 1.2))  # client-go's jitter factor 1.2

    def acquire(self, stop: threading.Event) -> bool:
        """Block until this replica leads (True) or ``stop`` is set (False)."""
        logger.info("leader election: %s standing by for Lease %s/%s", self.identity, self.namespace, self.name)
        while not stop.is_set():
            if self.try_acquire_or_renew():
                logger.info("leader election: %s became leader (leaseTransitions %s)", self.identity,
                            self._observed_spec.get("leaseTransitions"))
                self.leading.set()
                return True
            self._pause(stop)
        return False

    def renew(self, stop: threading.Event) -> bool:
        """Keep renewing; returns False as soon as a renewal has failed for ``renew_deadline`` (leadership lost),
        True when ``stop`` is set first."""
        while not stop.is_set():
            deadline = self.clock() + self.timings.renew_deadline
            while not self.try_acquire_or_renew():
                if self.clock() >= deadline:
                    self.leading.clear()
                    logger.error("leader election: %s could not renew Lease %s/%s within %.1f s: leadership lost",
                                 self.identity, self.namespace, self.name, self.timings.renew_deadline)
                    return False
                if stop.wait(self.timings.retry_period / 2):
                    return True
            stop.wait(self.timings.retry_period)
        return True

    def release(self) -> None:
        """Give the Lease up (when still ours) so a standby takes over without waiting for it to expire."""
        if not self.leading.is_set():
            return
        self.leading.clear()
        try:
            lease = json.loads(self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False,
                                                              _request_timeout=self.timings.retry_period).data)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            now = micro_time()
            lease["spec"] = {"holderIdentity": "", "leaseDurationSeconds": 1, "acquireTime": now, "renewTime": now,
                             "leaseTransitions": spec.get("leaseTransitions", 0)}
            self.api.replace_namespaced_lease(self.name, self.namespace, lease,
                                              _request_timeout=self.timings.retry_period)
            logger.info("leader election: %s released Lease %s/%s", self.identity, self.namespace, self.name)
        except Exception as e:  # the Lease then simply expires
            logger.warning("leader election: releasing the Lease failed: %s", e)
