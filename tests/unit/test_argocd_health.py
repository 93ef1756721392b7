"""The chart's Argo CD health check (charts/ascend-train-operator/files/argocd-health.lua), run as Argo CD runs a
custom check (gopher-lua, Argo CD's util/lua set-up: `gitopscheck argocd`, controlplane/gitopscheck) on the
statuses the operator writes for each phase (lifecycle/kstatus.py), and the copy docs/gitops.md shows. The e2e
test (tests/e2e/test_helm_gitops.py) runs it on live jobs."""
from __future__ import annotations

import json
import re
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from ascend_cluster import build
from ascend_operator.lifecycle import kstatus
from ascend_operator.lifecycle.status import set_condition

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "charts" / "ascend-train-operator" / "files" / "argocd-health.lua"
AT = "2026-11-28T10:00:00Z"


def _job(status: dict | None, generation: int = 1, kind: str = "AscendTrainJob") -> dict:
    obj = {"apiVersion": "ascendtrain.dev/v1alpha1", "kind": kind,
           "metadata": {"name": "j", "namespace": "default", "generation": generation}, "spec": {}}
    if status is not None:
        obj["status"] = status
    return obj


def _phase(phase: str, type_: str, reason: str, message: str) -> dict:
    status = {"phase": phase, "observedGeneration": 1,
              "conditions": set_condition([], type_, "True", reason, message, AT)}
    return kstatus.conditions(status, AT)


@pytest.fixture(scope="module")
def health():
    binary = str(build.binaries(build.GITOPSCHECK) / "gitopscheck")

    def run(obj: dict) -> dict:
        out = subprocess.run([binary, "argocd", str(SCRIPT)], input=json.dumps(obj), capture_output=True, text=True,
                             timeout=60, check=True)
        return {k: v for k, v in json.loads(out.stdout).items() if k in ("status", "message")}
    return run


@pytest.mark.parametrize("kind", ["AscendTrainJob", "DatasetPrep", "CheckpointConvert"])
def test_each_phase_reads_as_argo_cd_expects(health, kind):
    assert health(_job(None, kind=kind))["status"] == "Progressing"
    assert health(_job({"observedGeneration": 0}, kind=kind)) == {
        "status": "Progressing", "message": "Waiting for the operator to observe generation 1"}
    running = _phase("Running", "Running", "PodsRunning", "2/2 pods ready")
    assert health(_job(running, kind=kind)) == {"status": "Progressing", "message": "2/2 pods ready"}
    done = _phase("Succeeded", "Succeeded", "JobSucceeded", "all 2 pods completed")
    assert health(_job(done, kind=kind)) == {"status": "Healthy", "message": "all 2 pods completed"}
    failed = _phase("Failed", "Failed", "PodFailed", "pod j-0-0 failed: ValueError: bad")
    assert health(_job(failed, kind=kind)) == {"status": "Degraded", "message": "pod j-0-0 failed: ValueError: bad"}
    held = _phase("Suspended", "Suspended", "Suspended", "runPolicy.suspend is set")
    assert health(_job(held, kind=kind)) == {"status": "Suspended", "message": "runPolicy.suspend is set"}
    # A spec change the operator has not recorded yet (a runPolicy edit) is in progress again.
    assert health(_job(done, generation=2, kind=kind))["status"] == "Progressing"


def test_docs_show_the_charts_script_for_each_kind():
    text = (REPO / "docs" / "gitops.md").read_text()
    block = re.search(r"```yaml\n(apiVersion: v1\nkind: ConfigMap\n.*?)```", text, re.S)[1]
    data = yaml.safe_load(block)["data"]
    script = "\n".join(line for line in SCRIPT.read_text().splitlines() if not line.startswith("--")) + "\n"
    assert data["resource.customizations.health.ascendtrain.dev_AscendTrainJob"] == script
    for kind in ("DatasetPrep", "CheckpointConvert"):
        assert f"resource.customizations.health.ascendtrain.dev_{kind}" in text
    assert textwrap.dedent(script) == script
