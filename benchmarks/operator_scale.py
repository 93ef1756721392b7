"""How the operator copes with many jobs applied at once, against the loopback API server.

For each N (default 100 and 500): a fresh API server, the operator as its own process, N two-pod
AscendTrainJobs created at once from 8 client threads. Prints p50/p95 of apply -> all of the job's pods created,
the time until every job has a status (reconciled), and the operator's resident memory (now and peak).

    .venv/bin/python benchmarks/operator_scale.py [N ...]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml
from kubernetes import client, config

from ascend_operator.local.apiserver import LocalApiServer

ROOT = Path(__file__).resolve().parents[1]
GROUP, VERSION, PLURAL = "ascendtrain.dev", "v1alpha1", "ascendtrainjobs"
NNODES = 2


def _job(name: str) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AscendTrainJob", "metadata": {"name": name},
            "spec": {"image": "engine:bench", "nnodes": NNODES, "train": {"training": {"globalBatchSize": 2}}}}


def _rss_mib(pid: int) -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def run(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, LocalApiServer() as server:
        kubeconfig = server.write_kubeconfig(Path(tmp) / "kubeconfig")
        conf = client.Configuration()
        config.load_kube_config(str(kubeconfig), client_configuration=conf)
        conf.connection_pool_maxsize = 16
        api = client.ApiClient(conf)
        ext = client.ApiextensionsV1Api(api)
        for path in sorted((ROOT / "crds").glob("*.yaml")):
            ext.create_custom_resource_definition(yaml.safe_load(path.read_text()))
        env = dict(os.environ, KUBECONFIG=str(kubeconfig), ASCEND_OPERATOR_METRICS_PORT="0")
        log = open(Path(tmp) / "operator.log", "w")
        operator = subprocess.Popen([sys.executable, "-m", "ascend_operator.main", "run", "-A", "--standalone"],
                                    env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            time.sleep(3)  # the operator starts watching
            custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
            applied: dict[str, float] = {}

            def apply(i: int) -> None:
                name = f"job-{i:04d}"
                custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, _job(name))
                applied[name] = time.monotonic()

            start = time.monotonic()
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(apply, range(n)))
            apply_s = time.monotonic() - start
            all_pods: dict[str, float] = {}
            reconciled_at = None
            while time.monotonic() - start < 600:
                counts: dict[str, int] = {}
                for pod in core.list_namespaced_pod("default").items:
                    job = pod.metadata.labels["ascendtrain.dev/job-name"]
                    counts[job] = counts.get(job, 0) + 1
                t = time.monotonic()
                for job, count in counts.items():
                    if count == NNODES and job not in all_pods:
                        all_pods[job] = t
                if reconciled_at is None:
                    jobs = custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)["items"]
                    if sum(1 for j in jobs if (j.get("status") or {}).get("phase")) == n:
                        reconciled_at = t
                if len(all_pods) == n and reconciled_at is not None:
                    break
                time.sleep(0.1)
            latencies = sorted(all_pods[j] - applied[j] for j in all_pods)
            rss, peak = _rss_mib(operator.pid)
            p95 = latencies[int(0.95 * (len(latencies) - 1))] if latencies else float("nan")
            print(f"N={n:4d} jobs ({n * NNODES} pods): applied in {apply_s:.1f}s; "
                  f"apply -> all pods created p50 {statistics.median(latencies):.2f}s p95 {p95:.2f}s "
                  f"({len(latencies)}/{n} jobs); all reconciled after "
                  f"{(reconciled_at or float('nan')) - start:.1f}s; operator RSS {rss:.0f} MiB (peak {peak:.0f} MiB)",
                  flush=True)
        finally:
            operator.terminate()
            operator.wait(30)
            log.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jobs", nargs="*", type=int, default=[100, 500], help="how many jobs to apply at once, per run")
    for n in parser.parse_args(argv).jobs:
        run(n)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
