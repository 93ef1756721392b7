"""The long fault-sequence run (``make test-faults``): FAULT_WORKERS pytest processes of test_fault_sequences.py,
each with its own control plane and operator, FAULT_SEQUENCES shared between them. A sequence mostly waits (for
quiescence, for a node's heartbeat to lapse), so workers side by side finish sooner on the same cores.

Prints each worker's lines prefixed with its number, a line every 25 sequences with the total, and a summary;
exits non-zero when a worker fails (its output ends with the sequence, shrunk by Hypothesis)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

PROGRESS = re.compile(r"^sequence (\d+)/\d+: (\d+) steps")


def main() -> int:
    total = int(os.environ.get("FAULT_SEQUENCES", "2000"))
    workers = max(1, int(os.environ.get("FAULT_WORKERS", "3")))
    shares = [total // workers + (i < total % workers) for i in range(workers)]
    started, lock = time.monotonic(), threading.Lock()
    done, longest = [0] * workers, [0]

    def follow(i: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            match = PROGRESS.match(line)
            if not match:
                print(f"[worker {i + 1}] {line}", end="", flush=True)
                continue
            with lock:
                done[i] = int(match[1])
                longest[0] = max(longest[0], int(match[2]))
                if sum(done) % 25 == 0 or sum(done) == total:
                    print(f"{sum(done)}/{total} sequences passed, longest {longest[0]} steps, "
                          f"{time.monotonic() - started:.0f} s", flush=True)

    command = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-o", "timeout=0",
               os.path.join(os.path.dirname(__file__), "test_fault_sequences.py")]
    procs = [subprocess.Popen(command, env={**os.environ, "FAULT_SEQUENCES": str(n)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for n in shares]
    threads = [threading.Thread(target=follow, args=(i, p)) for i, p in enumerate(procs)]
    for t in threads:
        t.start()
    codes = [p.wait() for p in procs]
    for t in threads:
        t.join()
    failed = [i + 1 for i, code in enumerate(codes) if code]
    print(f"fault sequences: {sum(done)} run ({total} asked; Hypothesis may run a few more), "
          f"{'all passed' if not failed else 'not all passed'} in {workers} workers, longest {longest[0]} steps, "
          f"{time.monotonic() - started:.0f} s" + (f"; worker(s) {failed} FAILED" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
