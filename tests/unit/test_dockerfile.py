"""The Dockerfile's pinned versions agree with pyproject.toml and the Makefile (no Docker engine needed)."""
from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _instructions() -> list[tuple[str, str, str | None]]:
    """(instruction, arguments, stage) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    out, stage = [], None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        if op.upper() == "FROM":
            m = re.search(r"\bAS\s+(\S+)", rest, re.IGNORECASE)
            stage = m.group(1) if m else None
        out.append((op.upper(), rest.strip(), stage))
    return out


def _args() -> dict[str, str]:
    return dict(rest.split("=", 1) for op, rest, _ in _instructions() if op == "ARG" and "=" in rest)


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _dependency(name: str) -> Requirement:
    return next(r for r in map(Requirement, _pyproject()["dependencies"]) if r.name == name)


def test_the_four_targets_exist():
    stages = [s for op, _, s in _instructions() if op == "FROM"]
    assert stages == ["operator", "engine-cpu", "engine-cuda", "engine-ascend"]


def test_torch_and_megatron_pins_satisfy_pyproject_and_the_makefile():
    args = _args()
    assert Version(args["TORCH_VERSION"]) in _dependency("torch").specifier
    assert Version(args["MEGATRON_CORE_VERSION"]) in _dependency("megatron-core").specifier
    makefile_pin = re.search(r"TORCH_PIN \?= torch==(\S+)", (ROOT / "Makefile").read_text()).group(1)
    assert args["TORCH_VERSION"] == makefile_pin


def test_torch_npu_is_the_matching_pair_of_torch():
    args = _args()
    assert Version(args["TORCH_NPU_VERSION"]).release[:3] == Version(args["TORCH_VERSION"]).release[:3]


def test_python_of_the_images_satisfies_requires_python():
    python = re.search(r"python:(\d+\.\d+)", _args()["PYTHON_IMAGE"]).group(1)
    ascend = re.search(r"py(\d)(\d+)", _args()["ASCEND_BASE"])
    spec = Requirement(f"python{_pyproject()['requires-python']}").specifier
    assert Version(python) in spec and Version(f"{ascend.group(1)}.{ascend.group(2)}") in spec


def test_operator_image_installs_exactly_the_operator_extra_and_no_torch():
    runs = [rest for op, rest, stage in _instructions() if op == "RUN" and stage == "operator"]
    words = [w for run in runs for w in shlex.split(run)]
    installed = {str(Requirement(w)) for w in words if re.match(r"^[A-Za-z0-9_.-]+[<>=!~]", w)}
    assert installed == {str(Requirement(r)) for r in _pyproject()["optional-dependencies"]["operator"]}
    assert "--no-deps" in words and not any(w.startswith("torch") for w in words)


def test_engine_images_install_the_pinned_versions():
    for stage in ("engine-cpu", "engine-cuda", "engine-ascend"):
        runs = " ".join(rest for op, rest, s in _instructions() if op == "RUN" and s == stage)
        assert '"torch==${TORCH_VERSION}"' in runs and '"megatron-core==${MEGATRON_CORE_VERSION}"' in runs, stage


def test_operator_image_user_is_the_charts_non_root_user():
    user = next(rest for op, rest, stage in _instructions() if op == "USER" and stage == "operator")
    values = yaml.safe_load((ROOT / "charts" / "ascend-train-operator" / "values.yaml").read_text())
    uid, gid = (int(x) for x in user.split(":"))
    assert (values["podSecurityContext"]["runAsUser"], values["podSecurityContext"]["runAsGroup"]) == (uid, gid)
