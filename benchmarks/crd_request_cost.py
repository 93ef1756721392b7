"""kube-apiserver's CPU for one create and one status write of an AscendTrainJob, against a batch Job's.

``operator_scale.py versus`` measures whole jobs; this takes the two requests apart, on one control plane whose
controllers are paused (SIGSTOP: kube-controller-manager and kube-scheduler add nothing while a batch is measured).
Each round sends, per variant and interleaved, ``-n`` creates (4 client threads) and then as many status merge
patches (what the operator's first status write says: phase, one condition, replicas), reading kube-apiserver's
CPU from /proc around each batch, and deletes them. Variants:

- ``AscendTrainJob``: the CRD as ``crds/`` has it, under a group of its own;
- ``... without CEL rules``: the same schema with every ``x-kubernetes-validations`` removed (what the rules cost);
- ``--crd NAME=FILE``: any other AscendTrainJob CRD file (another revision's, a variant being tried);
- ``Job``: an Indexed batch/v1 Job of the same pods (``operator_scale.py``'s), its status patched the same way.

Usage::

    .venv/bin/python benchmarks/crd_request_cost.py [-n 200] [--rounds 3] [--crd NAME=FILE ...]
"""
from __future__ import annotations

import argparse
import copy
import datetime
import http.client
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

import yaml
from ascend_cluster.controlplane import ControlPlane

sys.path.insert(0, str(Path(__file__).resolve().parent))
from operator_scale import _batch_job_body, _cpu_job_body, _cpu_s  # noqa: E402 - the same bodies as versus mode

ROOT = Path(__file__).resolve().parents[1]
CRD_FILE = ROOT / "crds" / "ascendtrainjobs.ascendtrain.dev.yaml"
NAMESPACE = "default"
THREADS = 4


def _without_rules(node):
    if isinstance(node, dict):
        return {k: _without_rules(v) for k, v in node.items() if k != "x-kubernetes-validations"}
    if isinstance(node, list):
        return [_without_rules(v) for v in node]
    return node


def _crd(path: Path) -> dict:
    return next(d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "CustomResourceDefinition")


class Variant:
    """One kind of object to create and patch: its collection's path and a body for a name."""

    def __init__(self, label: str, collection: str, body, status: dict) -> None:
        self.label, self.collection, self.body, self.status = label, collection, body, status


def _custom_variant(plane: ControlPlane, label: str, crd: dict, index: int) -> Variant:
    """``crd`` installed under group ``v<index>.bench.ascendtrain.dev`` (its rules and schema unchanged)."""
    crd = copy.deepcopy(crd)
    group = f"v{index}.bench.ascendtrain.dev"
    crd["spec"]["group"] = group
    crd["metadata"] = {"name": f"{crd['spec']['names']['plural']}.{group}"}
    plane.request("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", "POST", crd)
    version = next(v["name"] for v in crd["spec"]["versions"] if v.get("storage"))
    collection = f"/apis/{group}/{version}/namespaces/{NAMESPACE}/{crd['spec']['names']['plural']}"
    deadline = time.monotonic() + 60
    while True:
        try:
            plane.request(collection)
            break
        except Exception:  # noqa: BLE001 - 404 until the CRD is established and served
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)

    def body(name: str) -> dict:
        return {**_cpu_job_body(name, 2), "apiVersion": f"{group}/{version}"}
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {"phase": "Pending", "observedGeneration": 1, "replicas": {"active": 2},
              "conditions": [{"type": "Created", "status": "True", "reason": "PodsCreated",
                              "message": "2 pods created", "lastTransitionTime": now}]}
    return Variant(label, collection, body, status)


def _job_variant() -> Variant:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return Variant("Job", f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs", lambda name: _batch_job_body(name, 2),
                   {"active": 2, "ready": 0, "startTime": now, "uncountedTerminatedPods": {}})


class Clients:
    """``THREADS`` keep-alive admin connections to kube-apiserver."""

    def __init__(self, plane: ControlPlane) -> None:
        parsed = urlparse(plane.server)
        self.connections = [http.client.HTTPSConnection(parsed.hostname, parsed.port, context=plane._admin_tls(),
                                                        timeout=60) for _ in range(THREADS)]

    def send(self, worker: int, method: str, path: str, body: dict, content_type: str) -> None:
        conn = self.connections[worker]
        conn.request(method, path, json.dumps(body), {"Content-Type": content_type})
        answer = conn.getresponse()
        text = answer.read()
        if answer.status >= 300:
            raise RuntimeError(f"{method} {path}: {answer.status} {text[:300]!r}")

    def each(self, items: list, send) -> None:
        shards = [items[i::THREADS] for i in range(THREADS)]
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(lambda w: [send(w, item) for item in shards[w]], range(THREADS)))


def _measure(apiserver_pid: int, work) -> float:
    before = _cpu_s(apiserver_pid)
    work()
    time.sleep(0.5)  # what the server does after answering (watch fan-out) belongs to the batch
    return _cpu_s(apiserver_pid) - before


def _round(plane: ControlPlane, clients: Clients, pid: int, variant: Variant, n: int, r: int) -> tuple[float, float]:
    names = [f"r{r}-{i:04d}" for i in range(n)]
    create = _measure(pid, lambda: clients.each(names, lambda w, name: clients.send(
        w, "POST", variant.collection, variant.body(name), "application/json")))
    patch = _measure(pid, lambda: clients.each(names, lambda w, name: clients.send(
        w, "PATCH", f"{variant.collection}/{name}/status", {"status": variant.status},
        "application/merge-patch+json")))
    plane.request(f"{variant.collection}?propagationPolicy=Background", "DELETE")
    while plane.request(variant.collection)["items"]:
        time.sleep(0.2)
    return 1000 * create / n, 1000 * patch / n


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} [{min(values):.2f}-{max(values):.2f}]"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200, help="objects a variant and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--crd", action="append", default=[], metavar="NAME=FILE",
                        help="another AscendTrainJob CRD to measure beside crds/'s")
    args = parser.parse_args(argv)
    generated = _crd(CRD_FILE)
    crds = [("AscendTrainJob", generated), ("... without CEL rules", _without_rules(generated))]
    crds += [(name, _crd(Path(path))) for name, path in (item.split("=", 1) for item in args.crd)]
    with tempfile.TemporaryDirectory() as tmp:
        plane = ControlPlane(Path(tmp), fast_storage=True, say=lambda *a, **k: print(*a, file=sys.stderr)).start()
        paused = [c.process.pid for c in plane.components if c.name in ("kube-controller-manager", "kube-scheduler")]
        try:
            for pid in paused:
                os.kill(pid, signal.SIGSTOP)
            variants = [_custom_variant(plane, label, crd, i) for i, (label, crd) in enumerate(crds)]
            variants.append(_job_variant())
            apiserver = next(c.process.pid for c in plane.components if c.name == "kube-apiserver")
            clients = Clients(plane)
            figures: dict[str, list[tuple[float, float]]] = {v.label: [] for v in variants}
            print(f"kube-apiserver CPU a request, {args.n} of each a round, {args.rounds} rounds interleaved "
                  f"({THREADS} client threads; kube-controller-manager and kube-scheduler paused)", flush=True)
            for r in range(args.rounds):
                for variant in variants:
                    figures[variant.label].append(_round(plane, clients, apiserver, variant, args.n, r))
                    create, patch = figures[variant.label][-1]
                    print(f"  round {r + 1} {variant.label:<28} create {create:6.2f} ms  status patch {patch:6.2f} ms",
                          flush=True)
            job_create = statistics.median(c for c, _ in figures["Job"])
            job_patch = statistics.median(p for _, p in figures["Job"])
            print("median [min-max], ms of kube-apiserver CPU a request:")
            for label, rows in figures.items():
                creates, patches = [c for c, _ in rows], [p for _, p in rows]
                print(f"  {label:<28} create {_spread(creates):<22} ({statistics.median(creates) / job_create:4.2f}x "
                      f"a Job's)   status patch {_spread(patches):<22} "
                      f"({statistics.median(patches) / job_patch:4.2f}x)", flush=True)
        finally:
            for pid in paused:
                os.kill(pid, signal.SIGCONT)
            plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
