"""``ascend-operator run``: the kopf operator, the same code in a cluster and on the local cluster."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ascend-operator", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="watch AscendTrainJob, DatasetPrep and CheckpointConvert resources")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], help="watch this namespace (repeatable)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch the whole cluster")
    run.add_argument("--standalone", action="store_true", help="no peering with other operator replicas")
    run.add_argument("--peering", default=None, help="kopf peering name for HA replicas")
    run.add_argument("--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    run.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)

    import kopf

    from . import handlers  # noqa: F401  (registers the handlers)

    kopf.configure(verbose=args.verbose)  # kopf sets up logging itself (one line per record)
    kopf.run(
        clusterwide=args.all_namespaces or not args.namespace,
        namespaces=args.namespace,
        standalone=args.standalone,
        peering_name=args.peering,
        liveness_endpoint=args.liveness,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
