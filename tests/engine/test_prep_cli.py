"""``ascend-engine preprocess --config`` as the DatasetPrep pod runs it: a resource file, 2 workers, progress."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from prep_support import build_tokenizer, read_dataset, write_jsonl  # noqa: E402


@pytest.mark.engine
def test_datasetprep_pod_command(tmp_path):
    tokenizer = build_tokenizer(tmp_path / "tok")
    records = [{"conversations": [{"from": "human", "value": f"question {i}"}, {"from": "gpt", "value": f"answer {i}"}]}
               for i in range(3000)]
    data = write_jsonl(tmp_path / "chat.jsonl", records)
    resource = tmp_path / "dsp.yaml"
    resource.write_text(
        "apiVersion: ascendtrain.dev/v1alpha1\nkind: DatasetPrep\nmetadata:\n  name: chat\nspec:\n  prep:\n"
        f"    input: {data}\n    tokenizerNameOrPath: {tokenizer}\n    outputPrefix: {tmp_path / 'out' / 'chat'}\n"
        "    handlerName: SharegptStyleInstructionHandler\n    promptType: qwen\n    seqLength: 256\n"
        "    neatPack: true\n    workers: 2\n    logInterval: 1000\n")
    termination = tmp_path / "termination-log"
    env = {**os.environ, "ASCEND_TERMINATION_LOG": str(termination)}
    proc = subprocess.run([sys.executable, "-m", "ascend_engine", "preprocess", "--config", str(resource)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "[preprocess] 1000/" in proc.stderr and "records/s" in proc.stderr and "tokens/s" in proc.stderr
    summary = [line for line in proc.stderr.splitlines() if line.startswith("[preprocess] done in")]
    assert len(summary) == 1 and "3000 records" in summary[0]
    report = json.loads(termination.read_text())
    assert report["status"] == "Succeeded" and report["records"]["written"] == 3000
    manifest = json.loads(Path(report["manifest"]).read_text())
    assert manifest["sequences"] == len(read_dataset(f"{tmp_path / 'out' / 'chat'}_packed_input_ids_document"))
    assert all(len(s) == 256 for s in read_dataset(f"{tmp_path / 'out' / 'chat'}_packed_labels_document"))
