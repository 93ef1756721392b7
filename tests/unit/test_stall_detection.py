"""Hang detection's pure parts: the stall timeout derived from the time between advances with its floors, the
engine's notices served at /events, and the downwardAPI file through which the operator asks for stacks."""
from __future__ import annotations

import socket

import pytest

from ascend_engine import telemetry
from ascend_engine.stacks import STACK_DUMP_ANNOTATION, read_annotation
from ascend_operator.api.run_policy import StallDetection, TrainRunPolicy
from ascend_cluster.pod_environment import PodSetupError, downward_api_files, refresh_downward_api
from ascend_operator.progress.scrape import scrape_events
from ascend_operator.recovery.stall_clock import StallClock, stalled, timeout

POLICY = StallDetection(minSeconds=60, stepTimeFactor=10, startupSeconds=900, checkpointSeconds=1200)


def advancing(every: float, times: int, start: float = 0.0) -> StallClock:
    clock = StallClock(generation=0, since=start)
    for i in range(times):
        clock.observe(10 * (i + 1), False, start + every * (i + 1))
    return clock


def test_start_up_floor_until_the_iteration_has_advanced_twice():
    clock = StallClock(generation=0, since=0.0)
    assert timeout(POLICY, clock)[0] == 900
    assert stalled(POLICY, clock, 899.0) is None  # a slow rendezvous, model build or checkpoint load
    assert "no iteration reported yet" in stalled(POLICY, clock, 901.0)  # a rendezvous that never completes
    clock.observe(10, False, 30.0)
    assert timeout(POLICY, clock)[0] == 900  # one advance: no step time known yet


def test_derived_timeout_is_factor_times_median_with_a_floor():
    fast = advancing(every=2.0, times=5)
    assert timeout(POLICY, fast)[0] == 60  # 10 x 2 s is under minSeconds
    slow = advancing(every=30.0, times=5)
    assert timeout(POLICY, slow)[0] == pytest.approx(300)
    slow.intervals.append(3000.0)  # one outlier (a validation pass) does not move the median
    assert timeout(POLICY, slow)[0] == pytest.approx(300)
    message = stalled(POLICY, slow, slow.since + 301)
    assert message.startswith("iteration 50: no progress for 301s (timeout 300s, 10 x the median 30.0s")
    assert stalled(POLICY, slow, slow.since + 299) is None


def test_checkpoint_save_floor_and_fixed_override():
    clock = advancing(every=2.0, times=5)
    clock.observe(50, True, clock.since + 1)  # rank 0 reports a save in progress, iteration unchanged
    assert timeout(POLICY, clock)[0] == 1200 and stalled(POLICY, clock, clock.since + 600) is None
    clock.observe(50, False, clock.since + 700)
    assert stalled(POLICY, clock, clock.since + 700) is not None
    fixed = StallDetection(timeoutSeconds=20, minSeconds=60)
    assert timeout(fixed, advancing(every=2.0, times=5))[0] == 20


def test_advance_resets_the_clock_and_a_finished_run_never_stalls():
    clock = advancing(every=2.0, times=5)
    clock.dump_requested_at = 5.0
    assert clock.observe(60, False, 100.0) and clock.since == 100.0 and clock.dump_requested_at is None
    clock.observe(100, False, 110.0, total=100)
    assert stalled(POLICY, clock, 1e9) is None  # the final save and an evaluation follow without iterations


def test_stall_detection_lives_in_the_train_jobs_mutable_run_policy():
    policy = TrainRunPolicy.model_validate({"stallDetection": {"minSeconds": 30, "stackDumpSeconds": 5}})
    assert policy.stallDetection.minSeconds == 30 and policy.stallDetection.startupSeconds == 1800
    with pytest.raises(ValueError, match="minSecond"):
        TrainRunPolicy.model_validate({"stallDetection": {"minSecond": 30}})


def test_engine_events_are_served_with_ids_the_operator_reads(monkeypatch):
    monkeypatch.setattr(telemetry, "_EVENTS", [])
    telemetry.emit_event("Warning", "CheckpointFallback", "iteration 20 is damaged; resuming from 10")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    metrics = telemetry.Metrics()
    metrics.serve(port, "127.0.0.1")
    try:
        telemetry.emit_event("Normal", "Other", "x" * 2000)
        events = scrape_events(f"http://127.0.0.1:{port}")
    finally:
        metrics.server.shutdown()
    assert [(e["reason"], e["seq"]) for e in events] == [("CheckpointFallback", 1), ("Other", 2)]
    assert events[0]["id"].endswith("-1") and events[0]["id"] != events[1]["id"]
    assert len(events[1]["message"]) == 1000
    assert scrape_events(f"http://127.0.0.1:{port}") == []  # not answering: nothing, no error


def test_downward_api_annotations_file_is_refreshed_and_read_back(tmp_path):
    pod = {"metadata": {"name": "j-0", "namespace": "default", "uid": "u1",
                        "labels": {"app": "x"}, "annotations": {"b": 'say "hi"', "a": "1"}},
           "spec": {"volumes": [{"name": "info", "downwardAPI": {"items": [
               {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
               {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
               {"path": "app", "fieldRef": {"fieldPath": "metadata.labels['app']"}}]}}]}}
    refresh_downward_api(pod, tmp_path)
    annotations = tmp_path / "volumes" / "info" / "annotations"
    assert annotations.read_text() == 'a="1"\nb="say \\"hi\\""'  # the kubelet's FormatMap: sorted, %q-quoted
    assert (tmp_path / "volumes" / "info" / "name").read_text() == "j-0"
    assert (tmp_path / "volumes" / "info" / "app").read_text() == "x"
    assert read_annotation(str(annotations), STACK_DUMP_ANNOTATION) is None
    pod["metadata"]["annotations"][STACK_DUMP_ANNOTATION] = "0-2026-01-01T00:00:00Z"
    refresh_downward_api(pod, tmp_path)
    assert read_annotation(str(annotations), STACK_DUMP_ANNOTATION) == "0-2026-01-01T00:00:00Z"
    assert read_annotation(str(annotations), "b") == 'say "hi"'
    with pytest.raises(PodSetupError, match="spec.nodeName"):
        downward_api_files(pod, {"items": [{"path": "n", "fieldRef": {"fieldPath": "spec.nodeName"}}]}, "info")
