"""``ascend-operator run``: the kopf operator, the same code in a cluster and on the local cluster."""
from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from urllib.parse import quote

# Exit code when a leader could not renew its Lease: the container restarts and stands by (controller-runtime
# managers exit the same way, "leader election lost").
EXIT_LEADERSHIP_LOST = 3


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ascend-operator", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="watch AscendTrainJob, DatasetPrep and CheckpointConvert resources")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], help="watch this namespace (repeatable)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch the whole cluster")
    ha = run.add_mutually_exclusive_group()
    ha.add_argument("--standalone", action="store_true", help="one replica, no leader election (the default)")
    ha.add_argument("--leader-elect", action="store_true",
                    help="HA replicas: only the holder of a coordination.k8s.io Lease runs the handlers")
    run.add_argument("--leader-election-id", default="ascend-train-operator", help="name of the Lease")
    run.add_argument("--leader-election-namespace", default=os.environ.get("POD_NAMESPACE", "default"),
                     help="namespace of the Lease (default: $POD_NAMESPACE, else default)")
    run.add_argument("--health", default=None, metavar="HOST:PORT",
                     help="serve /healthz (liveness) and /readyz (readiness), e.g. 0.0.0.0:8080")
    run.add_argument("-v", "--verbose", action="store_true")
    from .release import add_parser
    add_parser(sub)
    return parser.parse_args(argv)


def _first_watch(namespaces: list[str]) -> None:
    """One short watch on AscendTrainJobs with the operator's credentials (readiness)."""
    from .api.group import API_GROUP, API_VERSION, TRAIN_JOB
    from .client.kubeclient import kube

    path = f"/apis/{API_GROUP}/{API_VERSION}"
    path += f"/namespaces/{quote(namespaces[0])}/{TRAIN_JOB.plural}" if namespaces else f"/{TRAIN_JOB.plural}"
    response = kube().request("GET", path, query={"watch": "true", "timeoutSeconds": 1}).response
    response.read()
    response.release_conn()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.command == "release-finalizers":
        from . import release
        return release.main(args)

    import kopf
    from kubernetes import client

    from .kinds import single_pod, train_job  # noqa: F401  (registers the kinds)
    from .lifecycle import startup  # noqa: F401  (kopf's start-up and clean-up handlers)
    from . import settings
    from .client.kubeclient import kube
    from .health import Probes, first_watch_answered
    from .leader_election import LeaderElector, LeaseTimings

    from .lifecycle import workers
    workers.WATCHED_NAMESPACES[:] = args.namespace  # the pod informer watches what kopf watches
    kopf.configure(verbose=args.verbose)  # kopf sets up logging itself (one line per record)
    stop, kopf_ready, watching = threading.Event(), threading.Event(), threading.Event()
    elector = None
    if args.leader_elect:
        identity = f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4()}"
        timings = LeaseTimings(settings.LEASE_DURATION_S, settings.LEASE_RENEW_DEADLINE_S,
                               settings.LEASE_RETRY_PERIOD_S)
        elector = LeaderElector(client.CoordinationV1Api(kube().api), args.leader_election_namespace,
                                args.leader_election_id, identity, timings)

    def live() -> bool:
        if elector is None or kopf_ready.is_set():
            return True
        return time.monotonic() - elector.last_attempt < 3 * elector.timings.lease_duration  # standby loop turns

    def ready() -> bool:
        if elector is not None and not elector.leading.is_set():
            return elector.reached_api.is_set()
        return watching.is_set() and workers.synced()

    if args.health:
        host, _, port = args.health.rpartition(":")
        Probes(live, ready).serve(host or "0.0.0.0", int(port))
    if elector is not None:
        if not elector.acquire(stop):
            return 0

        def keep_leading() -> None:
            if not elector.renew(stop):
                logging.getLogger(__name__).error("exiting: another replica may lead now")
                os._exit(EXIT_LEADERSHIP_LOST)  # handlers must stop at once, not finish under two leaders
        threading.Thread(target=keep_leading, name="lease-renewal", daemon=True).start()

    def when_kopf_ready() -> None:
        kopf_ready.wait()
        first_watch_answered(lambda: _first_watch(args.namespace), stop, watching)
    threading.Thread(target=when_kopf_ready, name="readiness", daemon=True).start()
    failed: list[BaseException] = []

    def run_kopf() -> None:
        try:
            kopf.run(
                clusterwide=args.all_namespaces or not args.namespace,
                namespaces=args.namespace,
                standalone=True,  # one active replica is the Lease's job, not kopf peering's
                ready_flag=kopf_ready,
                stop_flag=stop,
            )
        except BaseException as e:  # noqa: BLE001  (reported by the main thread)
            failed.append(e)

    # kopf runs in a thread of its own so that SIGTERM reaches this thread first: it stops new work at once
    # (STOPPING: no retries, queued reconciles return) and bounds the exit by SHUTDOWN_GRACE_S, which kopf's
    # own handling does not (it waits for every worker thread, each retrying against an API server that may be
    # gone).
    from .client.kubeclient import STOPPING

    def on_signal(signum: int, _frame: object) -> None:
        logging.getLogger(__name__).info("%s received: stopping within %.0fs", signal.Signals(signum).name,
                                         settings.SHUTDOWN_GRACE_S)
        STOPPING.set()
        stop.set()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    operator = threading.Thread(target=run_kopf, name="kopf")
    operator.start()
    while operator.is_alive() and not stop.is_set():
        operator.join(0.5)
    STOPPING.set()
    stop.set()
    operator.join(settings.SHUTDOWN_GRACE_S)
    if elector is not None:
        elector.release()
    if operator.is_alive():  # worker threads still inside a call: end the process regardless
        logging.getLogger(__name__).warning("exiting with handlers still running after %.0fs",
                                            settings.SHUTDOWN_GRACE_S)
        logging.shutdown()
        os._exit(0)
    if failed:
        raise failed[0]
    return 0


if __name__ == "__main__":
    sys.exit(main())
