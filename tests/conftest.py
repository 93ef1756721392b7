"""Every test, and every process a test starts, keeps its caches (e.g. preprocessing's exact-BPE stamps) in a
folder of this session instead of the user's ~/.cache, and runs torch with one intra-op thread.

One thread: the processes the tests start share the machine's few cores (two ranks of a job, two pods of the
local cluster, the operator). torchrun sets OMP_NUM_THREADS=1 itself only with several processes per node; a
local cluster's pods run one process each, so each took every core and their spinning threads fought (the
quickstart's tiny TP2 job: 3.7 s an iteration instead of 0.07 s on a loaded 2-core machine). The pytest process
already imported torch, so its own thread count is unchanged."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from kube_fixtures import api_client, control_plane, kubeconfig, namespace  # noqa: E402,F401 (fixtures)


@pytest.fixture(scope="session", autouse=True)
def control_plane_binaries_first_on_path():
    """``kubectl`` in a test is the one built at the control plane's release (``make test`` builds it first)."""
    from ascend_cluster import build

    folder = str(build.binaries(build.KUBERNETES))
    os.environ["PATH"] = os.pathsep.join([folder, os.environ.get("PATH", "")])
    yield


@pytest.fixture(scope="session", autouse=True)
def session_cache_home(tmp_path_factory):
    previous = {name: os.environ.get(name) for name in ("XDG_CACHE_HOME", "OMP_NUM_THREADS")}
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    yield
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


# The longest files first: `make test` runs two workers that take whole files in collection order (pytest-xdist
# --dist loadfile --no-loadscope-reorder), so the minutes-long end-to-end and engine files start at once and the
# many short unit files fill the gaps at the end, instead of an e2e file starting last and running alone.
_TIER_ORDER = ("e2e", "engine", "operator", "unit")


def pytest_collection_modifyitems(items):
    def tier(item) -> int:
        parts = Path(str(item.fspath)).parts
        return next((i for i, name in enumerate(_TIER_ORDER) if name in parts[-3:-1]), len(_TIER_ORDER))

    items.sort(key=tier)  # stable: each tier keeps its files' and tests' own order
