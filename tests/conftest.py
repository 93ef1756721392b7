"""Every test, and every process a test starts, keeps its caches (e.g. preprocessing's exact-BPE stamps) in a
folder of this session instead of the user's ~/.cache."""
from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def session_cache_home(tmp_path_factory):
    previous = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if previous is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = previous
