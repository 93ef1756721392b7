"""The first code the sandboxed interpreter runs, before the untrusted program (standard library only: this file's
text is passed with ``python -I -S -c``, inside a filesystem view that holds no project code).

It locks the process down with what the kernel enforces and the program cannot undo: resource limits with equal
soft and hard values, the highest OOM score (inherited by what it starts) and, where bubblewrap did not (the
``landlock`` isolation), ``no_new_privs``, a parent-death signal, a Landlock domain (files: read-only below the
interpreter's folders, read-write below the work directory, nothing else; TCP: nothing; signals and abstract
unix sockets: only inside the domain) and the seccomp filter the evaluator compiled with libseccomp. Then it
reads the program from stdin (an in-memory file) and runs it as ``__main__``. Only a program that returns
has the evaluator's nonce (the first line of stdin, closed before the program starts) written to stderr:
``sys.exit`` is reported as an exit before the end, and ``os._exit(0)`` or a signal leave no nonce, so none of them
is a pass (OpenAI's human-eval decides the same). A program that searched this process's memory for the nonce could
forge it; an exit cannot. Arguments: ``NAME=VALUE,...``
rlimits, the Landlock ABI (0: none), the filter's descriptor (-1: none), the readable folders joined by ``:``. Only cheap modules are imported on the bubblewrap path (interpreter
start-up is most of a program's cost).
"""
import os
import resource
import sys

_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, _SIGKILL = 1, 38, 22, 2, 9
_LANDLOCK_CREATE, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT = 444, 445, 446  # the same numbers on every arch
_READ_FILE_RIGHTS = 1 | 4  # EXECUTE | READ_FILE
_READ_DIR_RIGHTS = 1 | 4 | 8  # ... | READ_DIR
_FILE_RIGHTS = {1: 1 | 2 | 4, 3: 1 | 2 | 4 | (1 << 14), 5: 1 | 2 | 4 | (1 << 14) | (1 << 15)}


def _confine(abi: int, seccomp_fd: int, readable: list[str]) -> None:
    """no_new_privs, parent-death signal, Landlock, seccomp: the ``landlock`` isolation's own set-up."""
    import ctypes

    class Ruleset(ctypes.Structure):
        _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long

    def check(result: int, what: str) -> int:
        if result < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"sandbox set-up: {what}: {os.strerror(err)}")
        return result

    check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    check(libc.prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0), "parent-death signal")
    if abi:
        handled = (1 << 13) - 1 | (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0) | \
            (1 << 15 if abi >= 5 else 0)
        file_rights = _FILE_RIGHTS[5 if abi >= 5 else 3 if abi >= 3 else 1]
        attr = Ruleset(handled, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)  # net: TCP bind+connect; both scopes
        size = 24 if abi >= 6 else 16 if abi >= 4 else 8
        ruleset = check(libc.syscall(_LANDLOCK_CREATE, ctypes.byref(attr), size, 0), "landlock_create_ruleset")
        rules = [(p, _READ_DIR_RIGHTS, _READ_FILE_RIGHTS) for p in readable] + \
            [("/dev/null", 0, file_rights & ~1), (os.getcwd(), handled, file_rights)]
        for path, dir_rights, file_only in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            rule = PathBeneath((dir_rights if os.path.isdir(path) else file_only) & handled, fd)
            check(libc.syscall(_LANDLOCK_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0), f"landlock rule {path}")
            os.close(fd)
        check(libc.syscall(_LANDLOCK_RESTRICT, ruleset, 0), "landlock_restrict_self")
        os.close(ruleset)
    if seccomp_fd >= 0:
        with os.fdopen(seccomp_fd, "rb") as f:
            program = f.read()
        buffer = ctypes.create_string_buffer(program, len(program))
        prog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
        check(libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), "seccomp filter")


def _main() -> None:
    limits, abi, seccomp_fd, readable = sys.argv[1:5]
    for item in limits.split(","):
        name, value = item.split("=")
        resource.setrlimit(getattr(resource, name), (int(value), int(value)))
    try:  # the limits are per process: if the machine runs out of memory, the OOM killer takes these first
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    if int(abi) or int(seccomp_fd) >= 0:
        _confine(int(abi), int(seccomp_fd), readable.split(":"))
    nonce, _, source = sys.stdin.read().partition("\n")
    os.close(0)  # sys.stdin.close() leaves the descriptor open, and /proc/self/fd/0 would show the nonce again
    sys.argv = ["program"]
    # locals: the program may clear this module's globals (sys.modules["__main__"] is this file)
    write, leave, streams = os.write, os._exit, (sys.stdout, sys.stderr)
    try:
        exec(compile(source, "<program>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as e:
        write(2, f"\nSystemExit({e.code!r}): the program exited before its end\n".encode())
        leave(1)
    for stream in streams:
        stream.flush()
    write(2, f"\n{nonce}\n".encode())


_main()
