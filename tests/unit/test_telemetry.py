"""Rank 0's metrics endpoint as the operator reads it: nothing before the first report, then the figures."""
import json
import re
import socket
import threading
import time
import urllib.request
from wsgiref.simple_server import ServerHandler

from ascend_engine import telemetry
from ascend_engine.telemetry import Metrics
from ascend_operator.progress.scrape import scrape


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_operator_reads_only_what_the_engine_has_reported():
    port = _free_port()
    metrics = Metrics()
    metrics.serve(port, "127.0.0.1")
    url = f"http://127.0.0.1:{port}/metrics"
    assert scrape(url) == {}  # no "loss 0 at iteration 0" before training reports
    metrics.set(iteration=7, trainIters=30, loss=2.25, tokensPerSecond=1234.5, lastCheckpointIteration=None)
    assert scrape(url) == {"iteration": 7, "trainIters": 30, "loss": 2.25, "tokensPerSecond": 1234.5}
    metrics.set(loss=2.302585092994046, learningRate=0.00029999999)  # rounded for the status people read
    figures = scrape(url)
    assert (figures["loss"], figures["learningRate"]) == (2.3026, 0.0003)
    assert scrape(f"http://127.0.0.1:{_free_port()}/metrics") is None  # nobody there: no figures, no error


def test_preference_rewards_reach_the_job_status():
    from ascend_engine.telemetry import preference_fields
    from ascend_operator.api.train_job import TrainProgress

    port = _free_port()
    metrics = Metrics()
    metrics.serve(port, "127.0.0.1")
    step = {"lm loss": 0.5, "rewards/chosen": 0.25, "rewards/rejected": -0.5, "rewards/margins": 0.75,
            "rewards/accuracies": 1.0}
    metrics.set(iteration=3, loss=step["lm loss"], **preference_fields(step))
    progress = TrainProgress.model_validate(scrape(f"http://127.0.0.1:{port}/metrics"))
    assert (progress.rewardsChosen, progress.rewardsRejected, progress.rewardMargin, progress.rewardAccuracy) == \
        (0.25, -0.5, 0.75, 1.0)
    assert preference_fields({"lm loss": 2.0}) == {}  # SFT reports no rewards
    metrics.set(iteration=4, **preference_fields({"lm loss": 0.2, "steps/accuracy": 0.75}))  # prm
    assert TrainProgress.model_validate(scrape(f"http://127.0.0.1:{port}/metrics")).stepAccuracy == 0.75


def test_a_long_start_up_step_is_said_again_until_the_command_has_started(capsys, monkeypatch):
    """Importing torch and Megatron-core takes tens of seconds on a busy machine: the step is said again every
    HEARTBEAT_S (with its own seconds) so a pod's log is never silent for long, and no more once started up."""
    monkeypatch.setattr(telemetry, "HEARTBEAT_S", 0.3)
    monkeypatch.setattr(telemetry, "_START_UP", telemetry._StartUp())
    monkeypatch.delenv("RANK", raising=False)
    started = time.perf_counter()
    telemetry.say("train", "importing torch", started)
    time.sleep(1.4)
    telemetry.say("train", "building the model", started)
    time.sleep(0.9)
    telemetry.started_up()
    before = capsys.readouterr().err.splitlines()
    time.sleep(1.0)
    assert capsys.readouterr().err == ""  # quiet once the command speaks for itself
    assert before[0].startswith("[train]") and before[0].endswith("s importing torch")
    still = [line for line in before if "still importing torch" in line]
    assert len(still) >= 2 and all(re.search(r"s still importing torch \(\d+s\)$", line) for line in still), before
    assert before.index(next(line for line in before if line.endswith("s building the model"))) > before.index(still[-1])
    assert any("still building the model (" in line for line in before), before


def _run_waiting_at_exit(monkeypatch) -> tuple[str, threading.Event]:
    """A run in a pod the operator made (``POD_IP``) that logged iterations 1-3 and now waits at exit for the
    operator: its endpoint's URL, and an event set once the wait is over."""
    port = _free_port()
    metrics = Metrics()
    metrics.serve(port, "127.0.0.1")
    for i in (1, 2, 3):
        metrics.set(iteration=i, loss=4.0 - i)
    monkeypatch.setenv("POD_IP", "127.0.0.1")
    metrics.expect_reader()
    released = threading.Event()
    threading.Thread(target=lambda: (metrics._wait_for_reader(), released.set()), daemon=True).start()
    return f"http://127.0.0.1:{port}", released


def test_a_run_waiting_at_exit_for_the_operator_is_released_only_once_the_series_is_written(monkeypatch):
    """A reader that does not say what it kept (an older operator): the run exits as soon as it is released, and
    released before the response is written, the read of the series dies with the process and the dashboard's
    history keeps only the final point."""
    url, released = _run_waiting_at_exit(monkeypatch)
    released_before_write = []
    write = ServerHandler.write

    def slow_write(self, data):
        time.sleep(0.3)  # a loaded machine: the waiter had time to run
        released_before_write.append(released.is_set())
        write(self, data)

    monkeypatch.setattr(ServerHandler, "write", slow_write)
    time.sleep(0.2)
    assert not released.is_set()  # nobody has read yet
    with urllib.request.urlopen(f"{url}/series", timeout=10) as response:
        assert [p["iteration"] for p in json.loads(response.read())] == [1, 2, 3]
    assert released.wait(10) and released_before_write == [False]


def test_a_run_waiting_at_exit_is_released_once_the_operator_has_kept_its_newest_point(monkeypatch):
    """The operator says with each read what the job's history holds: one that read every point and died before
    keeping them (restarted mid-write) must not have released the run, or the curve's tail is lost."""
    from ascend_operator.progress.scrape import scrape_series

    url, released = _run_waiting_at_exit(monkeypatch)
    assert [p["iteration"] for p in scrape_series(url, 1)] == [1, 2, 3]  # read all, kept only the first
    assert not released.wait(0.5)
    scrape_series(url, 3)  # the next read: the history holds them all
    assert released.wait(10)
