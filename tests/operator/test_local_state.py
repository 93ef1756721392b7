"""The local cluster keeps its objects and files across restarts unless started --fresh, and a backgrounded
`ascend-train local up` stops cleanly on SIGINT or `ascend-train local down` (etcd keeps its state)."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ascend_train.cli import main
from ascend_cluster.cluster import LocalCluster
from ascend_cluster.resource_client import ResourceClient

pytestmark = pytest.mark.operator

CONFIG_MAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kept", "namespace": "default"},
              "data": {"k": "v"}}


def test_objects_and_claim_files_survive_a_restart_and_fresh_wipes_them(tmp_path):
    root = tmp_path / "cluster"
    with LocalCluster(root, fast_storage=True, crds_dir=None) as cluster:
        resources = cluster.client()
        created, _ = resources.apply(CONFIG_MAP)
        resources.close()
        checkpoint = root / "pvc" / "default" / "workspace" / "latest_checkpointed_iteration.txt"
        checkpoint.parent.mkdir(parents=True)
        checkpoint.write_text("20")
    with LocalCluster(root, fast_storage=True, crds_dir=None) as cluster:
        resources = cluster.client()
        kept = resources.get(resources.resolve("cm"), "kept", "default")
        obj, action = resources.apply({**CONFIG_MAP, "data": {"k": "w"}})
        resources.close()
    assert kept["metadata"]["uid"] == created["metadata"]["uid"] and kept["data"] == {"k": "v"}
    assert action == "configured" and int(obj["metadata"]["resourceVersion"]) > int(kept["metadata"]["resourceVersion"])
    assert checkpoint.read_text() == "20"
    with LocalCluster(root, fast_storage=True, crds_dir=None, fresh=True) as cluster:
        resources = cluster.client()
        names = [o["metadata"]["name"] for o in resources.list(resources.resolve("cm"), "default")]
        resources.close()
    assert "kept" not in names and not checkpoint.exists()


def _background_up(root: Path) -> subprocess.Popen:
    """`ascend-train local up &` from a script: the shell starts it with SIGINT ignored."""
    process = subprocess.Popen(
        [sys.executable, "-m", "ascend_train.cli", "--root", str(root), "local", "up", "--no-operator"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    deadline = time.monotonic() + 60
    while not (root / "local-up.pid").exists():
        assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
        time.sleep(0.1)
    return process


def test_backgrounded_up_stops_on_sigint_and_on_local_down(tmp_path, capsys):
    root = tmp_path / "cluster"
    process = _background_up(root)
    process.send_signal(signal.SIGINT)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0, out
    assert "stopping the local cluster" in out and (root / "etcd" / "member").is_dir()  # etcd keeps the objects
    assert not (root / "local-up.pid").exists()

    process = _background_up(root)
    assert main(["--root", str(root), "local", "up"]) == 1  # one cluster per root
    assert "already runs" in capsys.readouterr().err
    # Node faults from another shell: a cordon is an API call, a lost or added node the `local up` process's work.
    for action, name in (("cordon", "local"), ("lose", "local"), ("add", "node-2")):
        assert main(["--root", str(root), "local", "node", action, name]) == 0, capsys.readouterr().err
    assert main(["--root", str(root), "local", "node", "lose", "local"]) == 1
    assert "no running node local (running: node-2)" in capsys.readouterr().err
    resources = ResourceClient(root / "kubeconfig")
    nodes = {n["metadata"]["name"]: n for n in resources.list(resources.resolve("nodes"), None)}
    resources.close()
    assert nodes["local"]["spec"]["unschedulable"] is True and set(nodes) == {"local", "node-2"}
    assert main(["--root", str(root), "local", "down"]) == 0
    assert f"pid {process.pid}" in capsys.readouterr().out
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0, out
    assert main(["--root", str(root), "local", "down"]) == 1  # nothing runs any more
    assert "no local cluster runs" in capsys.readouterr().err
