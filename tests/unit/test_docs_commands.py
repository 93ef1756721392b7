"""Every shell block of README.md and docs/ that a reader would type is run here as written (issue 39), in page
order, in one folder per page that holds what a reader has at hand: the repository's ``examples/``, the seeds'
MindSpeed-LLM scripts the pages import, a job file ``job.yaml``, and for data preparation a tiny tokenizer
(``./qwen3``), ``alpaca.jsonl`` and a ``dsp.yaml`` (``examples/make_tiny_assets.py``'s). A block that fails
fails the suite with the page and line.

A block is not run when the comment on the line before its fence says why (test_docs.py checks the markers):
``needs: real cluster``, ``needs: device``, ``needs: data`` (a user's data or checkpoints at real paths),
``needs: local cluster`` (the local cluster's walkthrough: tests/e2e runs its steps), or ``excerpt`` (a script's
text or a console transcript, not commands). A ``text`` block marked ``output`` right after a run block must be
what that block printed.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from test_docs import PAGES, ROOT, SHELLS, blocks, rel

NOT_RUN = {"needs: real cluster", "needs: device", "needs: data", "needs: local cluster", "excerpt"}
SEED_SCRIPTS = ROOT / "tests" / "unit" / "fixtures" / "scripts"


def runs(block) -> bool:
    return block.lang in SHELLS and not block.markers & NOT_RUN


RUN_PAGES = [p for p in PAGES if any(runs(b) for b in blocks(p))]


def reader_folder(folder: Path) -> Path:
    """What a reader of the pages has in the folder they type in: the tokenizer and the records are the ones
    examples/make_tiny_assets.py writes (no model: no page here needs one)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_tiny_assets", ROOT / "examples" / "make_tiny_assets.py")
    assets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(assets)
    (folder / "examples").symlink_to(ROOT / "examples")
    for script in SEED_SCRIPTS.glob("*.sh"):
        shutil.copy(script, folder)
    shutil.copy(ROOT / "examples" / "quickstart.yaml", folder / "job.yaml")
    (folder / "qwen3").mkdir()
    assets.make_tokenizer(folder / "qwen3")
    (folder / "alpaca.jsonl").write_text("".join(json.dumps(r) + "\n" for r in assets.RECORDS * 4))
    (folder / "dsp.yaml").write_text(yaml.safe_dump({
        "input": "alpaca.jsonl", "tokenizerNameOrPath": "./qwen3", "handlerName": "AlpacaStyleInstructionHandler",
        "promptType": "qwen", "seqLength": 256, "pack": True, "outputPrefix": "data/from-config"}))
    return folder


@pytest.mark.parametrize("page", RUN_PAGES, ids=rel)
def test_the_pages_commands_run_as_written(page, tmp_path):
    folder = reader_folder(tmp_path)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               HOME=str(tmp_path))
    printed = None
    for block in blocks(page):
        if "output" in block.markers and printed is not None:
            assert printed == block.text, f"{block.where()}: the page shows another output than the command " \
                                          f"prints:\n{printed}"
        if not runs(block):
            continue
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.text], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (f"{block.where()}: exit {done.returncode}\n{block.text}\n"
                                      f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
        printed = done.stdout
