"""What a status patch costs the local API server's schema and CEL validation: ratcheted (the update leaves the
spec unchanged, so neither its schema nor its rules are judged again, as kube-apiserver 1.30+ does) against
everything validated (what each PATCH cost before ratcheting, and what a create costs).

For every example AscendTrainJob: the stored object and the same object with a new status.progress, validated
with ``CustomResourceSchema.errors`` the way the server's write path calls it. A and B are interleaved 3 times;
prints the median and spread of the per-call time.

    .venv/bin/python benchmarks/apiserver_cel.py [--calls 50]
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import yaml

from ascend_operator.local.crd_schema import CustomResourceSchema

ROOT = Path(__file__).resolve().parents[1]


def _jobs(schema: CustomResourceSchema) -> list[dict]:
    jobs = []
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "AscendTrainJob":
                jobs.append(schema.prepare(doc))
    return jobs


def _per_call(schema: CustomResourceSchema, jobs: list[dict], ratcheted: bool, calls: int) -> float:
    start = time.perf_counter()
    for i in range(calls):
        for old in jobs:
            new = {**old, "status": {"phase": "Running", "progress": {"iteration": i, "loss": 2.0 / (i + 1)}}}
            assert schema.errors(new, old if ratcheted else None) == []
    return (time.perf_counter() - start) / (calls * len(jobs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    crd = yaml.safe_load((ROOT / "crds" / "ascendtrainjobs.ascendtrain.dev.yaml").read_text())
    schema = CustomResourceSchema(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    jobs = _jobs(schema)
    times: dict[str, list[float]] = {"every rule": [], "ratcheted": []}
    for _ in range(3):
        times["every rule"].append(_per_call(schema, jobs, False, args.calls))
        times["ratcheted"].append(_per_call(schema, jobs, True, args.calls))
    for name, values in times.items():
        print(f"{name:>10}: {statistics.median(values) * 1e3:7.3f} ms per status patch "
              f"(spread {min(values) * 1e3:.3f}-{max(values) * 1e3:.3f}, {len(jobs)} jobs x {args.calls} patches x 3)")
    print(f"ratio: {statistics.median(times['every rule']) / statistics.median(times['ratcheted']):.1f}x")


if __name__ == "__main__":
    main()
