"""The operator's work queue: a burst of events is one reconcile, a job is never reconciled twice at once, and a
job storming the queue does not push other jobs back."""
import threading
import time

from ascend_operator.cache.workqueue import WorkQueue, Workers


def test_a_burst_of_adds_is_one_item():
    q = WorkQueue()
    for _ in range(1000):
        q.add("big")
    q.add("small")
    assert len(q) == 2
    assert q.get(0) == "big" and q.get(0) == "small" and q.get(0) is None


def test_a_key_added_while_processed_comes_back_once_after_done_and_not_before():
    q = WorkQueue()
    q.add("big")
    assert q.get(0) == "big"
    for _ in range(100):
        q.add("big")  # events during the reconcile
    assert q.get(0) is None  # no second worker gets it meanwhile
    q.done("big")
    assert q.get(0) == "big"  # one more reconcile sees those events
    q.done("big")
    assert q.get(0) is None


def test_a_storming_job_waits_its_turn_behind_a_new_job():
    q = WorkQueue()
    q.add("big")
    assert q.get(0) == "big"
    q.add("big")
    q.add("small")
    q.done("big")
    assert [q.get(0), q.get(0)] == ["small", "big"]


def test_workers_never_run_one_key_twice_at_once_and_lose_no_event():
    q = WorkQueue()
    running: dict[str, int] = {}
    overlap, seen = [], []
    lock = threading.Lock()
    last_add: dict[str, int] = {}
    processed_after: dict[str, int] = {}

    def process(key):
        with lock:
            running[key] = running.get(key, 0) + 1
            overlap.append(running[key])
            stamp = last_add.get(key, 0)
        time.sleep(0.001)
        with lock:
            running[key] -= 1
            seen.append(key)
            processed_after[key] = max(processed_after.get(key, 0), stamp)

    workers = Workers(q, process, 4).start()
    try:
        for i in range(1, 2001):
            key = f"job-{i % 3}"
            with lock:
                last_add[key] = i
            q.add(key)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and processed_after != last_add:
            time.sleep(0.01)
    finally:
        workers.stop()
    assert max(overlap) == 1
    assert processed_after == last_add  # every key's last event was followed by a reconcile
    assert len(seen) < 2000  # coalesced


def test_a_failing_reconcile_does_not_stop_the_worker():
    q = WorkQueue()
    done = threading.Event()

    def process(key):
        if key == "bad":
            raise RuntimeError("boom")
        done.set()

    workers = Workers(q, process, 1).start()
    try:
        q.add("bad")
        q.add("good")
        assert done.wait(5)
    finally:
        workers.stop()
