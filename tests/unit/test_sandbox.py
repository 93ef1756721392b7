"""Hostile programs against the code sandbox, under each isolation this machine offers (bubblewrap namespaces,
and Landlock as in a pod without user namespaces): each is contained, the evaluator (this process) stays alive,
the run ends within its wall-clock limit plus a small constant, and nothing appears outside the work directory.

Each probe exits 0 when it found no way out and raises (naming the hole) when it found one, so "passed" means
contained; the host side checks the files and processes independently."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ascend_engine.evaluate.confinement import Isolation, bwrap_binary, landlock_abi
from ascend_engine.evaluate.sandbox import (SandboxUnavailable, detect_isolation, humaneval_program,
                                            require_isolation, run_program)

BOMB_TIMEOUT = 2.0  # the bombs run until killed: each burns its whole limit
TIMEOUT = 8.0  # the others end on their own, and must, even on a loaded 2-core machine
SLACK = 3.0  # start-up and tear-down there


def _isolations() -> list[Isolation]:
    found = []
    if bwrap_binary() and detect_isolation().name == "bubblewrap":
        found.append(detect_isolation())
    if landlock_abi():  # the kernel's, and the first ABI (as on 5.13-5.18 kernels: seccomp covers the rest)
        found += [Isolation("landlock", "", landlock_abi()), Isolation("landlock", "", 1)]
    return found


def _probes(canary: Path, victim: int, port: int, unix_path: str, marker: str) -> dict[str, str]:
    """name -> program. ``canary``: a host folder nothing may write into; ``victim``: a host process nothing may
    kill; ``port``/``unix_path``: host listeners nothing may reach; ``marker``: in every escape attempt's name."""
    c = str(canary)
    return {
        "chdir_relative_write": f"""
            import os
            os.chdir({c!r})
            try:
                open("{marker}", "w").write("x")
            except OSError:
                pass
            """,
        "dir_fd_write": f"""
            import os
            try:
                fd = os.open({c!r}, os.O_RDONLY)
                os.close(os.open("{marker}", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
            except OSError:
                pass
            """,
        "truncate_rename_link_out": f"""
            import os
            open("mine", "w").write("x")
            secret, out = {c + '/secret.txt'!r}, {c + '/' + marker!r}
            for attempt in (lambda: os.truncate(secret, 0), lambda: os.rename("mine", out),
                            lambda: os.link(secret, "stolen"), lambda: os.link("mine", out),
                            lambda: os.rename(secret, "stolen")):
                try:
                    attempt()
                except OSError:
                    pass
            """,
        "sqlite3_write": f"""
            import sqlite3
            try:
                sqlite3.connect({c + '/' + marker!r}).execute("create table t(x)")
            except sqlite3.Error:
                pass
            """,
        "clear_main_then_subprocess": f"""
            import sys, subprocess
            sys.modules["__main__"].__dict__.clear()
            import subprocess
            subprocess.run(["/bin/sh", "-c", "echo x > {c}/{marker}"])
            """,
        "posixsubprocess_fork_exec": f"""
            import _posixsubprocess, os
            r, w = os.pipe()
            # CPython 3.11's signature (as subprocess calls it), in a new session
            pid = _posixsubprocess.fork_exec([b"/bin/sh", b"-c", b"echo x > {c}/{marker}"], [b"/bin/sh"], True,
                (w,), None, None, -1, -1, -1, -1, -1, -1, r, w, True, True, -1, None, None, None, -1, None, True)
            os.waitpid(pid, 0)
            """,
        "kill_parent": """
            import os, signal
            try:
                os.kill(os.getppid(), signal.SIGKILL)
            except OSError:
                pass
            """,
        "kill_victim_and_pidfd": f"""
            import os, signal
            for attempt in (lambda: os.kill({victim}, signal.SIGKILL), lambda: os.killpg({victim}, signal.SIGKILL),
                            lambda: signal.pidfd_send_signal(os.pidfd_open({victim}), signal.SIGKILL)):
                try:
                    attempt()
                except OSError:
                    pass
            """,
        "ptrace_parent_and_victim": f"""
            import ctypes, os
            libc = ctypes.CDLL(None, use_errno=True)
            for pid in (os.getppid(), {victim}):
                if libc.ptrace(16, pid, 0, 0) == 0:  # PTRACE_ATTACH
                    raise SystemExit(f"ptrace attached to {{pid}}")
            """,
        "setsid_escape_then_write": f"""
            import os, time
            if os.fork() == 0:
                try:
                    os.setsid()
                except OSError:
                    pass
                if os.fork() == 0:
                    time.sleep(1.5)
                    open({c + '/' + marker + '.late'!r}, "w").write("x")
                os._exit(0)
            """,
        "leave_processes_behind": f"""
            import subprocess
            try:
                subprocess.Popen(["/bin/sleep", "{victim}.{len(marker)}"], start_new_session=True)
            except OSError:
                subprocess.Popen(["/bin/sleep", "{victim}.{len(marker)}"])
            """,
        "oom_killer_takes_it_first": """
            try:
                score = open("/proc/self/oom_score_adj").read().strip()
            except OSError:  # Landlock: /proc is not readable
                score = "1000"
            if score != "1000":
                raise SystemExit(f"oom_score_adj {score}")
            """,
        "fork_bomb": """
            import os
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
            """,
        "memory_bomb": """
            chunks = []
            while True:
                chunks.append(bytearray(64 << 20))
            """,
        "ipc_and_memfd_outside_the_memory_limit": """
            import os, ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            for call in (lambda: os.memfd_create("x"),
                         lambda: libc.shmget(0, 1 << 30, 0o1000 | 0o600) >= 0 or (_ for _ in ()).throw(OSError())):
                try:
                    call()
                    raise SystemExit("allocated memory outside RLIMIT_AS")
                except OSError:
                    pass
            """,
        "disk_bomb": """
            i = 0
            while True:
                try:
                    with open(f"fill{i}", "wb") as f:
                        f.write(b"x" * (16 << 20))
                except OSError:
                    pass
                i += 1
            """,
        "secrets_env_and_proc": f"""
            import os
            found = [k for k in os.environ if "ASCEND_TEST_SECRET" in k]
            for pid in (os.getppid(), {os.getpid()}, 1):
                for name in ("environ", "cmdline"):
                    try:
                        if b"ASCEND_TEST_SECRET" in open(f"/proc/{{pid}}/{{name}}", "rb").read():
                            found.append(f"/proc/{{pid}}/{{name}}")
                    except OSError:
                        pass
            for path in ({c + '/secret.txt'!r}, "/etc/shadow", os.path.expanduser("~root/.bash_history")):
                try:
                    open(path).read()
                    found.append(path)
                except OSError:
                    pass
            if found:
                raise SystemExit(f"read secrets: {{found}}")
            """,
        "network": f"""
            import socket
            reached = []
            for family, address in ((socket.AF_INET, ("127.0.0.1", {port})), (socket.AF_UNIX, {unix_path!r})):
                try:
                    s = socket.socket(family, socket.SOCK_STREAM)
                    s.settimeout(1)
                    s.connect(address)
                    reached.append(address)
                except OSError:
                    pass
            if reached:
                raise SystemExit(f"reached {{reached}}")
            """,
        "write_every_writable_looking_path": f"""
            import os
            wrote = []
            here = os.path.realpath(os.getcwd())
            for top in ("/", {c!r}, "/tmp", "/dev/shm", "/var/tmp", "/proc/self", "/proc/1"):
                for folder, dirs, _ in os.walk(top):
                    if folder.count("/") > 3 or folder.startswith(("/proc/sys", "/sys")):
                        dirs[:] = []
                    if os.path.realpath(folder).startswith(here):
                        continue
                    path = os.path.join(folder, "{marker}")
                    try:
                        open(path, "w").write("x")
                        wrote.append(path)
                    except OSError:
                        pass
                    for name in ("mkdir", "symlink"):
                        try:
                            os.mkdir(path + ".d") if name == "mkdir" else os.symlink("/", path + ".l")
                            wrote.append(path + "." + name)
                        except OSError:
                            pass
            if wrote:
                raise SystemExit(f"wrote outside: {{wrote[:5]}}")
            """,
    }


BOMBS = {"fork_bomb", "memory_bomb", "disk_bomb"}


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """The things hostile programs go after, each watched from here."""
    canary = tmp_path_factory.mktemp("canary")
    (canary / "secret.txt").write_text("ASCEND_TEST_SECRET")
    os.chmod(canary / "secret.txt", 0o666)
    os.chmod(canary, 0o777)  # writable by anyone: only the sandbox stands in the way
    # the sandbox's own user when this is root (it runs programs as nobody), so only the sandbox protects it
    victim = subprocess.Popen(["sleep", "300"], **({"user": 65534} if os.getuid() == 0 else {}))
    listener = socket.create_server(("127.0.0.1", 0))
    unix_path = str(canary / "unix.sock")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(unix_path)
    unix.listen()
    listener.setblocking(False)
    unix.setblocking(False)
    os.environ["ASCEND_TEST_SECRET"] = "1"
    yield canary, victim, listener, unix
    del os.environ["ASCEND_TEST_SECRET"]
    victim.kill()
    victim.wait()
    listener.close()
    unix.close()


@pytest.mark.parametrize("isolation", _isolations(), ids=lambda i: f"{i.name}{i.abi or ''}")
def test_hostile_programs_are_contained(host, isolation):
    canary, victim, listener, unix = host
    marker = f"ascend-escape-{isolation.name}{isolation.abi}"
    probes = _probes(canary, victim.pid, listener.getsockname()[1], unix.getsockname(), marker)
    before = set(os.listdir(canary))

    def run(item):
        name, source = item
        start = time.monotonic()
        limit = BOMB_TIMEOUT if name in BOMBS else TIMEOUT
        result = run_program(textwrap.dedent(source), limit, 256, isolation)
        return name, result, limit, time.monotonic() - start

    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(run, probes.items()))
    time.sleep(2.0)  # what the setsid probe's grandchild would write, had it survived
    self_checking = {"ptrace_parent_and_victim", "secrets_env_and_proc", "network", "write_every_writable_looking_path",
                     "ipc_and_memfd_outside_the_memory_limit", "oom_killer_takes_it_first"}
    for name, result, limit, seconds in outcomes:
        assert seconds < limit + SLACK, (name, seconds)
        assert name in BOMBS or result.reason != "timed out", name
        assert name not in self_checking or result.passed, (name, result.reason)
        assert not any(e in result.reason for e in ("TypeError", "NameError", "SyntaxError")), (name, result.reason)
    assert set(os.listdir(canary)) == before
    assert (canary / "secret.txt").read_text() == "ASCEND_TEST_SECRET"
    assert victim.poll() is None, "the victim process was killed"
    for accepting in (listener, unix):
        with pytest.raises(BlockingIOError):
            accepting.accept()
    leftovers = [p for p in Path("/proc").glob("[0-9]*") if _cmdline(p).startswith(f"/bin/sleep\0{victim.pid}.")]
    assert not leftovers, "a sandboxed process outlived its run"
    for folder in ("/tmp", "/dev/shm", "/var/tmp", os.path.expanduser("~"), os.getcwd()):
        assert not any(n.startswith(marker) for n in os.listdir(folder)), folder


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_text()
    except OSError:
        return ""


def test_humaneval_verdicts_and_time_limit():
    add = ("def add(a, b):\n", "def check(f):\n    assert f(2, 3) == 5\n", "add")
    assert run_program(humaneval_program(add[0], "    return a + b\n", add[1], add[2])).passed
    wrong = run_program(humaneval_program(add[0], "    return a - b\n", add[1], add[2]))
    assert not wrong.passed and "AssertionError" in wrong.reason
    start = time.monotonic()
    loop = run_program(humaneval_program(add[0], "    while True:\n        pass\n", add[1], add[2]), timeout_s=1)
    assert loop.reason == "timed out" and time.monotonic() - start < 1 + SLACK


@pytest.mark.parametrize("completion", [
    "    import sys\n    sys.exit(0)\n",
    "    import os\n    os._exit(0)\n",
    "    return a - b\nimport os\nos._exit(0)\n",  # the module ends before the tests run
    "    import threading, os\n    threading.Thread(target=os._exit, args=(0,)).start()\n    import time\n"
    "    time.sleep(5)\n",
], ids=["sys.exit", "os._exit", "module-level os._exit", "os._exit from a thread"])
def test_a_program_that_exits_before_its_tests_end_is_not_a_pass(completion):
    add = ("def add(a, b):\n", "def check(f):\n    assert f(2, 3) == 5\n", "add")
    result = run_program(humaneval_program(add[0], completion, add[1], add[2]))
    assert not result.passed, result.reason
    assert "before its end" in result.reason, result.reason


POD = r"""
import errno, os, sys
import pyseccomp as seccomp
f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
# what containerd's RuntimeDefault refuses without CAP_SYS_ADMIN: new namespaces, mounts
for name in ("unshare", "setns", "mount", "umount2"):
    f.add_rule(seccomp.ERRNO(errno.EPERM), name)
for flag in (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x80):
    f.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
f.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
if sys.argv[1] == "no-landlock":  # a kernel without Landlock, or a profile that does not list it
    f.add_rule(seccomp.ERRNO(errno.ENOSYS), "landlock_create_ruleset")
os.setgroups([]); os.setgid(65534); os.setuid(65534)
f.load()
from ascend_engine.cli import main
sys.exit(main(["evaluate", "--task", "humaneval", *sys.argv[2:]]))
"""


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to become nobody")
@pytest.mark.parametrize("kernel,opt_in", [("landlock", False), ("no-landlock", False), ("no-landlock", True)])
def test_in_a_pod_without_user_namespaces(kernel, opt_in):
    """`ascend-engine evaluate --task humaneval` as a non-root user under a RuntimeDefault-like seccomp profile:
    Landlock where the kernel has it; otherwise a refusal that names the opt-in, and with the opt-in the code
    runs with limits only, said so in the results. The evaluator runs on an interpreter nobody can reach, with
    this checkout and the virtualenv's packages on its path."""
    from ascend_engine.evaluate.confinement import interpreter

    python = interpreter()
    if not python.startswith("/usr/"):
        pytest.skip(f"no interpreter that nobody can run (have {python})")
    tmp_path = Path(tempfile.mkdtemp(prefix="ascend-pod-test-"))  # pytest's own folder is root's alone
    os.chmod(tmp_path, 0o777)
    try:
        _evaluate_as_in_a_pod(python, kernel, opt_in, tmp_path)
    finally:
        shutil.rmtree(tmp_path)


def _evaluate_as_in_a_pod(python: str, kernel: str, opt_in: bool, tmp_path: Path) -> None:
    import pydantic

    problems, samples, results = tmp_path / "problems.jsonl", tmp_path / "samples.jsonl", tmp_path / "results.json"
    problems.write_text(json.dumps({"task_id": "T/0", "prompt": "def f():\n", "entry_point": "f",
                                    "test": "def check(g):\n    assert g() == 1\n"}) + "\n")
    samples.write_text("".join(json.dumps({"task_id": "T/0", "completion": c}) + "\n"
                               for c in ("    return 1\n", f"    open({str(tmp_path / 'x')!r}, 'w')\n    return 1\n")))
    path = [str(Path(__file__).resolve().parents[2] / "engine"), str(Path(pydantic.__file__).parents[1])]
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path), "HOME": str(tmp_path)}
    flags = ["--task-data-path", str(problems), "--completions", str(samples), "--results-path", str(results)]
    out = subprocess.run([python, "-I", "-c", f"import sys; sys.path[:0] = {path!r}\n" + POD, kernel, *flags]
                         + (["--allow-unsandboxed-code"] if opt_in else []),
                         capture_output=True, text=True, env=env, timeout=120)
    if kernel == "no-landlock" and not opt_in:
        assert out.returncode == 2 and "allowUnsandboxedCode (flag --allow-unsandboxed-code)" in out.stderr
        assert "bubblewrap:" in out.stderr and "landlock:" in out.stderr and not results.exists()
        return
    assert out.returncode == 0, out.stderr
    report = json.loads(results.read_text())
    expected = "landlock" if kernel == "landlock" else "none"
    assert report["sandbox"].split()[0] == expected and f"under {expected}" in out.stderr
    # the write outside fails under Landlock; with limits only it succeeds (what the opt-in accepts)
    assert [p["correct"] for p in report["results"][0]["predictions"]] == [True, kernel != "landlock"]
    assert (tmp_path / "x").exists() == (kernel != "landlock")


def test_refusal_without_isolation_names_the_opt_in(monkeypatch):
    from ascend_engine.evaluate import sandbox

    monkeypatch.setattr(sandbox, "detect_isolation", lambda: Isolation("none", "nothing here"))
    with pytest.raises(SandboxUnavailable, match="allowUnsandboxedCode"):
        require_isolation(False)
    assert require_isolation(True).name == "none"
