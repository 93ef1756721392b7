"""`ascend-train local demo` as a new user sees it: after set-up it is never silent for more than 5 s, and a
second demo on the same cluster says it shows the earlier run instead of reporting it as new."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e


def _demo(root: Path, manifest: Path) -> list[tuple[float, str]]:
    """Every output line with the seconds since the start at which it arrived."""
    process = subprocess.Popen([sys.executable, "-m", "ascend_train.cli", "--root", str(root), "local",
                                "demo", "-f", str(manifest), "--timeout", "240"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    start, lines = time.monotonic(), []
    for line in process.stdout:
        lines.append((time.monotonic() - start, line.rstrip("\n")))
    assert process.wait(60) == 0, "\n".join(text for _, text in lines)
    return lines


def test_demo_is_never_silent_and_a_second_one_shows_the_earlier_run(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
    from test_convert_models import make_hf_model

    make_hf_model("qwen3", tmp_path / "hf")
    manifest = tmp_path / "convert.yaml"
    manifest.write_text(yaml.safe_dump({
        "apiVersion": "ascendtrain.dev/v1alpha1", "kind": "CheckpointConvert",
        "metadata": {"name": "tiny-hf2mcore", "namespace": "default"},
        "spec": {"image": "ascend-train/engine-cpu:0.1.0", "shmSize": None,
                 "convert": {"loadDir": str(tmp_path / "hf"), "saveDir": str(tmp_path / "mg"),
                             "targetTensorParallelSize": 2}}}))
    first = _demo(tmp_path / "cluster", manifest)
    text = "\n".join(line for _, line in first)
    assert first[0][1].startswith("starting the local cluster in ")
    up = next(i for i, (_, line) in enumerate(first) if line.startswith("local cluster up:"))
    gaps = [(later - earlier, line) for (earlier, _), (later, line) in zip(first[up:], first[up + 1:])]
    assert max(gaps)[0] <= 5.0, max(gaps)
    assert "1/1 succeeded in " in text and (tmp_path / "mg" / "latest_checkpointed_iteration.txt").exists()

    second = "\n".join(line for _, line in _demo(tmp_path / "cluster", manifest))
    assert "tiny-hf2mcore finished in an earlier demo" in second and "showing that run" in second
    assert "1/1 succeeded in the earlier run (finished " in second and "nothing was run now" in second
    assert "1/1 succeeded in " not in second.replace("1/1 succeeded in the earlier run", "")
