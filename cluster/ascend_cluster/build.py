"""Build the control plane's binaries from their own Go modules, once per machine and pin.

``controlplane/kubernetes`` pins ``k8s.io/kubernetes`` (its staging modules replaced by their published versions,
see ``pin.sh``) and etcd's server at the version that release requires; ``controlplane/kueue`` pins Kueue. Each is
built with ``CGO_ENABLED=0`` and the version ldflags Kubernetes' own build sets, into
``~/.cache/ascend-train/controlplane/<module>-<key>/bin`` (``ASCEND_CONTROLPLANE_CACHE`` moves it), where ``key``
hashes everything that decides the binaries (go.mod, go.sum, our Go files, the flags, the Go version): a build is
reused until one of them changes. The Go module and build caches (``go env GOMODCACHE GOCACHE``) are Go's own.

A build shows progress (packages compiled of the total, elapsed, an estimate of what is left) and ends with one
line; two processes that need the same build wait for each other (a lock file) rather than build it twice.
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

MODULES_DIR = Path(__file__).resolve().parents[2] / "controlplane"
PROGRESS_EVERY_S = 15.0


class BuildError(RuntimeError):
    """The binaries could not be built; the message says which command failed and how."""


@dataclass(frozen=True)
class GoModule:
    """A Go module of ours under ``controlplane/`` and the commands it builds (binary name -> package)."""

    folder: str
    commands: dict[str, str]
    minutes: int = 10  # what a fresh machine's build takes on 2 cores, the module download included (progress line)
    env: tuple[tuple[str, str], ...] = ()  # set for this module's go commands only
    version_flags: tuple[str, ...] = ()  # packages whose `version` variable is set to the required module's version
    version_of: str = ""

    @property
    def path(self) -> Path:
        return MODULES_DIR / self.folder

    def required_version(self, module: str) -> str:
        match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)} (v\S+)", (self.path / "go.mod").read_text(), re.M)
        if match is None:
            raise BuildError(f"{self.path / 'go.mod'} does not require {module}")
        return match.group(1)

    def source_dir(self, module: str, why: str) -> Path:
        """``module``'s source at the version this module pins (``go mod download`` fetches it when the module cache
        lacks it); ``why`` says what needs it, for the error when `go` is missing."""
        go = shutil.which("go")
        if go is None:
            raise BuildError(f"{why}, and `go` is not on PATH")
        pinned = f"{module}@{self.required_version(module)}"
        answer = subprocess.run([go, "mod", "download", "-json", pinned], cwd=self.path, capture_output=True,
                                text=True, env=dict(os.environ, GOFLAGS="-mod=mod"))
        try:
            return Path(json.loads(answer.stdout)["Dir"])
        except (ValueError, KeyError):
            raise BuildError(f"`go mod download -json {pinned}` failed: {answer.stderr or answer.stdout}") from None

    def ldflags(self) -> str:
        flags = ["-s", "-w"]
        if self.folder == "kubernetes":  # what hack/lib/version.sh sets, so `kubectl version` names the release
            version = self.required_version("k8s.io/kubernetes")
            major, minor = version.lstrip("v").split(".")[:2]
            for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
                flags += [f"-X {package}.{name}={value}" for name, value in (
                    ("gitVersion", version), ("gitMajor", major), ("gitMinor", minor), ("gitTreeState", "clean"),
                    ("buildDate", "1970-01-01T00:00:00Z"))]
        if self.version_of:  # what the module's own Makefile sets, so `helm version` names the release
            flags += [f"-X {variable}={self.required_version(self.version_of)}" for variable in self.version_flags]
        return " ".join(flags)


KUBERNETES = GoModule("kubernetes", {
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kubectl": "k8s.io/kubernetes/cmd/kubectl",
    "etcd": "./cmd/etcd",
}, minutes=25)
KUEUE = GoModule("kueue", {"kueue": "sigs.k8s.io/kueue/cmd/kueue"})
# The tools users reach the operator with (docs/install.md, docs/gitops.md), run for real by the e2e tests: Helm's
# CLI, Flux's source-controller and kustomize-controller (v1.9.6: controlplane/flux/go.mod says why not v1.10),
# and gitopscheck (kstatus' verdict and Argo CD's Lua health check).
HELM = GoModule("helm", {"helm": "helm.sh/helm/v3/cmd/helm"}, minutes=6, version_of="helm.sh/helm/v3",
                version_flags=("helm.sh/helm/v3/internal/version.version",))
FLUX = GoModule("flux", {"source-controller": "github.com/fluxcd/source-controller",
                         "kustomize-controller": "github.com/fluxcd/kustomize-controller"},
                minutes=15)
GITOPSCHECK = GoModule("gitopscheck", {"gitopscheck": "."}, minutes=2)
GITOPS = (HELM, FLUX, GITOPSCHECK)


def cache_root() -> Path:
    return Path(os.environ.get("ASCEND_CONTROLPLANE_CACHE") or Path.home() / ".cache" / "ascend-train" / "controlplane")


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise BuildError("the control plane is built from Go modules, and `go` is not on PATH (install Go 1.25+)")
    return go


def _key(module: GoModule, go: str) -> str:
    digest = hashlib.sha256()
    for path in sorted(module.path.rglob("*")):
        if path.is_file() and (path.suffix == ".go" or path.name in ("go.mod", "go.sum")):
            digest.update(str(path.relative_to(module.path)).encode() + b"\0" + path.read_bytes() + b"\0")
    if module.env:  # the toolchain this module asks for, without asking the go command to fetch it first
        version = dict(module.env).get("GOTOOLCHAIN", "")
    else:
        version = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=True).stdout.strip()
    digest.update(f"{module.ldflags()}\0{version}\0{sorted(module.commands.items())}".encode())
    if module.env:
        digest.update(repr(module.env).encode())
    return digest.hexdigest()[:12]


def binaries(module: GoModule, say=print) -> Path:
    """The folder holding ``module``'s binaries, built first if this pin has none yet."""
    if not module.path.is_dir():
        raise BuildError(f"{module.path} is missing: the control plane is built from the project's source tree")
    go = _go()
    target = cache_root() / f"{module.folder}-{_key(module, go)}"
    if (target / "bin").is_dir():
        return target / "bin"
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "bin").is_dir():
            _build(module, go, target, say)
    return target / "bin"


def _env(module: GoModule) -> dict[str, str]:
    return dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=mod -buildvcs=false", **dict(module.env))


def _build(module: GoModule, go: str, target: Path, say) -> None:
    names = ", ".join(module.commands)
    started = time.monotonic()
    say(f"building {names} from {module.path} (once per machine and pin; on a fresh machine about "
        f"{module.minutes} minutes on 2 cores, the module download included)", flush=True)
    packages = list(module.commands.values())
    listed = subprocess.run([go, "list", "-deps", *packages], cwd=module.path, env=_env(module), capture_output=True,
                            text=True)
    if listed.returncode != 0:
        raise BuildError(f"`go list -deps` in {module.path} failed:\n{listed.stderr.strip()[-3000:]}")
    total = len(listed.stdout.split())
    say(f"  modules downloaded; {total} packages to compile (those in Go's build cache are skipped)", flush=True)
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "bin").mkdir(parents=True)
    command = [go, "build", "-v", "-trimpath", "-ldflags", module.ldflags(), "-o", str(staging / "bin") + "/",
               *packages]
    process = subprocess.Popen(command, cwd=module.path, env=_env(module), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    done, tail = 0, []
    stop = threading.Event()

    def report() -> None:
        while not stop.wait(PROGRESS_EVERY_S):
            elapsed = time.monotonic() - started
            share = min(done / total, 0.99) if total else 0
            left = f", about {elapsed / share * (1 - share) / 60:.0f} min left" if share > 0.05 else ""
            say(f"  {done}/{total} packages compiled ({share:.0%}), {elapsed / 60:.1f} min{left}", flush=True)

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    assert process.stdout is not None
    for line in process.stdout:
        done += 1
        tail = (tail + [line.rstrip()])[-40:]
    code = process.wait()
    stop.set()
    if code != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise BuildError(f"`{' '.join(command[:3])} ...` in {module.path} exited {code}:\n" + "\n".join(tail))
    staging.rename(target)
    say(f"built {names} in {(time.monotonic() - started) / 60:.1f} min into {target / 'bin'}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m ascend_cluster.build [--link DIR]``: build (or find) every binary; ``--link`` puts a link to
    kubectl in DIR (a virtual environment's bin, so the kubectl of the control plane's release comes first)."""
    parser = argparse.ArgumentParser(prog="python -m ascend_cluster.build", description=main.__doc__)
    parser.add_argument("--link", type=Path,
                        help="link kubectl (and helm and gitopscheck, with --gitops) into this folder")
    parser.add_argument("--gitops", action="store_true",
                        help="also helm, Flux's source-controller and kustomize-controller, and gitopscheck")
    args = parser.parse_args(argv)
    try:
        folders = [binaries(module) for module in (KUBERNETES, KUEUE, *(GITOPS if args.gitops else ()))]
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.link:
        link = args.link / "kubectl"
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(folders[0] / "kubectl")
        if args.gitops:  # helm and gitopscheck (docs/gitops.md) on the virtual environment's PATH too
            for name, folder in (("helm", folders[2]), ("gitopscheck", folders[4])):
                link = args.link / name
                if link.is_symlink() or link.exists():
                    link.unlink()
                link.symlink_to(folder / name)
    print(f"control plane binaries: {', '.join(str(f) for f in folders)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
