"""Figures the docs state about the code are the code's: a page that says how many history points are kept says
``ascend_engine.series.MAX_POINTS`` (docs/sdk.md once said 200 while the README said 1000)."""
from __future__ import annotations

import re
from pathlib import Path

from ascend_engine.series import MAX_POINTS

ROOT = Path(__file__).resolve().parents[2]
HISTORY_POINTS = re.compile(r"(\d+) points a series")


def test_every_page_states_the_history_bound_of_the_code():
    stated = {}
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for number in HISTORY_POINTS.findall(page.read_text()):
            stated.setdefault(int(number), []).append(page.relative_to(ROOT).as_posix())
    assert len(sum(stated.values(), [])) >= 3, stated  # metrics.md, sdk.md and architecture.md say it
    assert set(stated) == {MAX_POINTS}, stated
