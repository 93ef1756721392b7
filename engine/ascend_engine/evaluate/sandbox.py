"""Run untrusted generated code (HumanEval completions) so that it cannot hurt the evaluator.

The program runs in a child ``python -I`` with: a fresh temporary directory as cwd (removed afterwards), limits on
address space, CPU time, file size and open files (``resource.setrlimit``), its own session so the whole process
group is killed at the wall-clock limit, a new network namespace when the kernel lets an unprivileged user make one
(``unshare``), and in any case an audit hook installed before the program runs that refuses sockets, subprocesses,
``ctypes`` and any file write, rename or removal outside its directory. Audit hooks cannot be removed from Python.
"""
from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

# Runs inside the child before the program; the program's source comes on stdin so no file names leak.
_GUARD = r'''
import os, sys
_root = os.path.realpath(os.getcwd())
_writes = ("w", "a", "x", "+")
_path_events = {"os.remove", "os.unlink", "os.rmdir", "os.rename", "os.replace", "os.mkdir", "os.symlink",
                "os.link", "os.chmod", "os.chown", "os.truncate", "shutil.rmtree", "shutil.copyfile",
                "shutil.move", "os.utime"}
_denied = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
           "os.forkpty", "os.kill", "os.killpg", "ctypes.", "pty.", "os.putenv", "sys.addaudithook")

def _inside(path):
    try:
        path = os.fsdecode(path)
    except TypeError:
        return True  # a file descriptor: already open
    return os.path.realpath(os.path.join(_root, path)).startswith(_root + os.sep)

def _hook(event, args):
    if event.startswith(_denied):
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open":
        path, mode = args[0], args[1]
        writing = (isinstance(mode, str) and any(c in mode for c in _writes)) or \
                  (isinstance(args[2], int) and args[2] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
        if writing and not _inside(path):
            raise PermissionError(f"sandbox: writing {path} is outside the sandbox")
    elif event in _path_events:
        for a in args:
            if isinstance(a, (str, bytes, os.PathLike)) and not _inside(a):
                raise PermissionError(f"sandbox: {event} on {a} is outside the sandbox")

_source = sys.stdin.read()
sys.addaudithook(_hook)
exec(compile(_source, "<completion>", "exec"), {"__name__": "__main__"})
'''

_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000


@dataclass
class RunResult:
    passed: bool
    reason: str  # "passed", "failed: <last line of stderr>", "timed out"


def _limits(memory_mb: int, cpu_s: int):
    def apply() -> None:
        os.setsid()
        mem = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        try:  # no network at all where the kernel allows unprivileged namespaces; the audit hook covers the rest
            libc = ctypes.CDLL(None, use_errno=True)
            libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET)
        except OSError:
            pass
    return apply


def run_program(source: str, timeout_s: float = 10.0, memory_mb: int = 1024) -> RunResult:
    """Run ``source`` in a guarded child; passed means exit status 0 within the time limit."""
    with tempfile.TemporaryDirectory(prefix="ascend-eval-code-") as workdir:
        env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.Popen([sys.executable, "-I", "-c", _GUARD], cwd=workdir, env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                preexec_fn=_limits(memory_mb, int(timeout_s) + 1), text=True)
        try:
            _, stderr = proc.communicate(source, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            return RunResult(False, "timed out")
        finally:
            _kill_group(proc)
        if proc.returncode == 0:
            return RunResult(True, "passed")
        last = (stderr or "").strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        return RunResult(False, f"failed: {last[0][:200]}")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def humaneval_program(prompt: str, completion: str, test: str, entry_point: str) -> str:
    """The program HumanEval runs: the prompt, the completion, the task's tests and ``check(<entry point>)``."""
    return f"{prompt}{completion}\n\n{test}\n\ncheck({entry_point})\n"
