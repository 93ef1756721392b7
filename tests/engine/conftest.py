"""Set-ups that several engine test modules share, each built once per session."""
from __future__ import annotations

import pytest

from memorised import train_memorised


@pytest.fixture(scope="session")
def memorised(tmp_path_factory) -> dict:
    """A tiny PP=2 checkpoint that has memorised 8 MMLU answers and a sentence (see ``memorised.py``)."""
    return train_memorised(tmp_path_factory.mktemp("memorised"))
