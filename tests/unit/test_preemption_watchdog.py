"""The preemption watchdog: a rank that does not reach a step boundary soon after SIGTERM (blocked in a collective
whose peer is gone) exits with the retryable code instead of waiting out the grace period; one that does reach
it keeps running to save its checkpoint."""
from __future__ import annotations

import subprocess
import sys
import time

SCRIPT = """
import os, signal, sys, time
from ascend_engine.train import preemption
if sys.argv[1] == "boundary":
    import torch  # loaded long before any SIGTERM in the engine
preemption.MIN_BOUNDARY_S = 1.0
watch = preemption.PreemptionWatch().install()
watch.step_done(0.1)
os.kill(os.getpid(), signal.SIGTERM)
if sys.argv[1] == "boundary":
    time.sleep(0.2)
    assert watch.agreed()  # a single process: no collective, the flag alone
    time.sleep(2.0)  # the save, longer than the boundary limit: must not be cut short
    watch.uninstall()
    print("saved")
    sys.exit(0)
time.sleep(30)  # never reaches a boundary
"""


def run(mode: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=60)
    return proc, time.monotonic() - start


def test_a_rank_stuck_after_sigterm_exits_retryably():
    proc, _ = run("stuck")
    assert proc.returncode == 143, proc.stderr
    assert "SIGTERM received" in proc.stdout and "no step boundary 1s after SIGTERM" in proc.stdout


def test_a_rank_at_a_step_boundary_is_left_to_save():
    proc, _ = run("boundary")
    assert proc.returncode == 0 and "saved" in proc.stdout, (proc.stdout, proc.stderr)
