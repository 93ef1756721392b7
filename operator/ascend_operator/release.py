"""``ascend-operator release-finalizers``: what ``helm uninstall`` runs (the chart's post-delete hook Job) so that no
pod is left behind on ``ascendtrain.dev/pod-tracking`` once no operator will ever remove it.

Every pod the operator creates carries that finalizer until the operator has counted the pod's end
(docs/faults.md). Without an operator, a pod deleted afterwards (its job deleted, a node drained, ``kubectl delete
pod``) would stay Terminating for good. The hook runs after Helm has deleted the release's Deployment: it waits
until the operator's own pods (``--operator-selector`` in ``--operator-namespace``) are gone, so no replica is
still shutting down and adding the finalizer to a pod it creates, releasing as it goes, then releases once more.
Only this finalizer is removed, with a JSON patch that tests it is still at that index (another controller's
finalizers stay). Jobs, their pods and their status are left as they are: reinstalling the chart takes them up
again (their pods then no longer hold their ends for the operator: a pod deleted while no operator watches is
counted as deleted, not by its last status).
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from typing import Any
from urllib.parse import quote

from kubernetes.client.rest import ApiException

from .api.group import LABEL_JOB_NAME, POD_FINALIZER

log = logging.getLogger("ascend_operator.release")


def add_parser(sub: Any) -> None:
    release = sub.add_parser("release-finalizers",
                             help=f"remove {POD_FINALIZER} from the job pods (helm uninstall's post-delete hook)")
    scope = release.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], help="only this namespace (repeatable)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace (the default)")
    release.add_argument("--operator-selector", default="",
                         help="label selector of the operator's pods: wait until none is left before the last pass")
    release.add_argument("--operator-namespace", default="default", help="namespace of the operator's pods")
    release.add_argument("--timeout", type=float, default=120.0,
                         help="seconds to wait for the operator's pods to go (then release anyway)")


def _pods(namespace: str | None, selector: str) -> list[dict[str, Any]]:
    from .client.kubeclient import kube

    path = f"/api/v1/namespaces/{quote(namespace)}/pods" if namespace else "/api/v1/pods"
    pods, token = [], None
    while True:
        query = {"labelSelector": selector, "limit": 500, "continue": token}
        page = json.loads(kube().request("GET", path, query=query).read())
        pods += page.get("items") or []
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return pods


def release(namespaces: list[str]) -> list[str]:
    """One pass: the finalizer removed from every job pod that has it; the pods released (namespace/name)."""
    from .client.kubeclient import kube

    released = []
    for namespace in namespaces or [None]:
        for pod in _pods(namespace, LABEL_JOB_NAME):
            meta = pod["metadata"]
            finalizers = meta.get("finalizers") or []
            if POD_FINALIZER not in finalizers:
                continue
            at = finalizers.index(POD_FINALIZER)
            patch = [{"op": "test", "path": f"/metadata/finalizers/{at}", "value": POD_FINALIZER},
                     {"op": "remove", "path": f"/metadata/finalizers/{at}"}]
            try:
                kube().request("PATCH", f"/api/v1/namespaces/{quote(meta['namespace'])}/pods/{quote(meta['name'])}",
                               patch, content_type="application/json-patch+json").read()
            except ApiException as e:
                if e.status in (404, 409, 422):  # gone, or changed under us: the next pass sees it again
                    continue
                raise
            released.append(f"{meta['namespace']}/{meta['name']}")
    return released


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    namespaces = [] if args.all_namespaces else list(args.namespace)
    done: list[str] = []
    deadline = time.monotonic() + args.timeout
    while True:
        done += release(namespaces)
        left = _pods(args.operator_namespace, args.operator_selector) if args.operator_selector else []
        if not left:
            done += release(namespaces)  # a replica that was still stopping may have created one more
            break
        if time.monotonic() > deadline:
            log.warning("%d operator pod(s) still there after %.0fs (%s): released anyway", len(left), args.timeout,
                        ", ".join(p["metadata"]["name"] for p in left))
            break
        time.sleep(1)
    log.info("released %s from %d pod(s)%s", POD_FINALIZER, len(done), f": {', '.join(done)}" if done else "")
    return 0
