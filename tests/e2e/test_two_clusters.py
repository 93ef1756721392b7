"""Two local clusters on one host at the same time, each running a two-pod torchrun gang on the same
MASTER_PORT: torchrun's rendezvous store listens on the wildcard address, which used to make the second gang
fail with EADDRINUSE. Each cluster owns its loopback network and each pod binds on its own IP, so both succeed."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from ascend_cluster.cluster import LocalCluster
from ascend_cluster.runner import read_logs

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    not (shutil.which("cc") or shutil.which("gcc")),
    reason="no C compiler for the local pods' network shim (Debian: apt-get install -y gcc libc6-dev)")]

WORKER = """
import os, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
print("SUM", int(total.item()), "MASTER", os.environ["MASTER_ADDR"], flush=True)
time.sleep(2)  # keep the rendezvous store up while the other cluster's gang starts
dist.destroy_process_group()
"""


def gang_pod(index: int, script: Path) -> dict:
    command = ["torchrun", "--nnodes=2", "--nproc-per-node=1", f"--node-rank={index}",
               "--master-addr=gang-0.gang.default.svc", "--master-port=29500", str(script)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"gang-{index}", "namespace": "default"},
            "spec": {"restartPolicy": "Never", "hostname": f"gang-{index}", "subdomain": "gang",
                     "containers": [{"name": "main", "image": "local", "command": command}]}}


def test_two_clusters_run_gangs_on_the_same_master_port_at_once(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    with LocalCluster(fast_storage=True, root=tmp_path / "a", crds_dir=None) as a, \
            LocalCluster(fast_storage=True, root=tmp_path / "b", crds_dir=None) as b:
        clients = [a.client(), b.client()]
        for resources in clients:
            for index in (0, 1):
                resources.apply(gang_pod(index, script))
        pods = [resources.resolve("pods") for resources in clients]
        deadline = time.monotonic() + 240
        phases: dict[tuple[int, str], str] = {}
        while time.monotonic() < deadline:
            for c, resources in enumerate(clients):
                for pod in resources.list(pods[c], "default"):
                    phases[(c, pod["metadata"]["name"])] = (pod.get("status") or {}).get("phase", "")
            if len(phases) == 4 and all(p in ("Succeeded", "Failed") for p in phases.values()):
                break
            time.sleep(0.5)
        logs = {(c, name): read_logs(cluster.root, "default", name)
                for c, cluster in enumerate((a, b)) for name in ("gang-0", "gang-1")}
        networks = (a.runner.network.prefix, b.runner.network.prefix)
        for resources in clients:
            resources.close()
    assert networks[0] != networks[1]
    for key, log in logs.items():
        assert phases.get(key) == "Succeeded", f"{key}: {phases}\n{log[-3000:]}"
        assert "SUM 3 MASTER " + networks[key[0]] + "." in log, log[-3000:]
