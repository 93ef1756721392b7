"""`kubectl apply --server-side` of the project's own admission policies over what the local cluster (or any
client) installed from the same files: no conflict (issue 52). Their matchConstraints is an atomic struct for
server-side apply, so a file without the fields kube-apiserver defaults in it differed from the stored object as
a whole and conflicted with the manager that had created it."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("manifest", ["crds/runtime-locks.yaml", "crds/immutable-spec.yaml",
                                      "charts/ascend-train-operator/crds"])
def test_server_side_apply_over_the_local_install_does_not_conflict(control_plane, kubeconfig, manifest):
    # The session's control plane installed crds/ as the local cluster does (create, then merge patches).
    out = subprocess.run(["kubectl", "apply", "--server-side", "-f", str(REPO / manifest)], capture_output=True,
                         text=True, timeout=120, env=dict(os.environ, KUBECONFIG=str(kubeconfig)))
    assert out.returncode == 0 and "conflict" not in out.stderr, out.stderr
    assert "serverside-applied" in out.stdout, out.stdout
