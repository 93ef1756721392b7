"""``ascend-engine wait-for-master``: waits for a port that opens late, reports a clear reason when it never does."""
import json
import socket
import subprocess
import sys
import threading
import time


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(port, *extra, env=None):
    return subprocess.run([sys.executable, "-m", "ascend_engine", "wait-for-master", "--addr=127.0.0.1",
                           f"--port={port}", "--interval=0.1", *extra], capture_output=True, text=True, env=env,
                          timeout=60)


def test_waits_for_a_master_that_comes_up_late_then_runs_the_command():
    port = _free_port()
    server = socket.socket()

    def open_later():
        time.sleep(1.0)
        server.bind(("127.0.0.1", port))
        server.listen()
    threading.Thread(target=open_later, daemon=True).start()
    done = _wait(port, "--timeout=30", "--", sys.executable, "-c", "print('torchrun would start')")
    server.close()
    assert done.returncode == 0, done.stderr
    assert "torchrun would start" in done.stdout and "answered after" in done.stderr


def test_gives_up_with_exit_124_and_a_report(tmp_path):
    import os
    log = tmp_path / "termination-log"
    done = _wait(_free_port(), "--timeout=0.5", "--", "false",
                 env=dict(os.environ, ASCEND_TERMINATION_LOG=str(log)))
    assert done.returncode == 124
    report = json.loads(log.read_text())
    assert report["reason"] == "MasterUnreachable" and "not reachable after 0.5s" in report["message"]
