"""The curve history the operator keeps per job: one point per new iteration, at most 200, shape kept."""
from ascend_operator.history import MAX_POINTS, add_point, config_map, read


def test_points_follow_iterations_and_stay_bounded_keeping_first_and_recent():
    points: list = []
    for iteration in range(1, 1001):
        points = add_point(points, {"iteration": iteration, "loss": 10.0 / iteration, "learningRate": 3e-4,
                                    "tokensPerSecond": 1000.0}, "t") or points
    assert len(points) <= MAX_POINTS and points[0]["iteration"] == 1 and points[-1]["iteration"] == 1000
    iterations = [p["iteration"] for p in points]
    assert iterations == sorted(iterations)
    assert iterations[-10:] == list(range(991, 1001))  # recent points stay dense
    assert add_point(points, {"iteration": 1000, "loss": 0.01, "learningRate": 3e-4,
                              "tokensPerSecond": 1000.0}, "t2") is None  # nothing new
    assert add_point(points, {"iteration": 1001}, "t") is None  # no figures yet


def test_a_gang_restart_from_an_older_checkpoint_replaces_the_abandoned_tail():
    points = []
    for iteration in (10, 20, 30):
        points = add_point(points, {"iteration": iteration, "loss": 1.0}, "t")
    points = add_point(points, {"iteration": 25, "loss": 0.9}, "t")
    assert [p["iteration"] for p in points] == [10, 20, 25]


def test_the_series_round_trips_through_an_owned_config_map():
    job = {"apiVersion": "ascendtrain.dev/v1alpha1", "kind": "AscendTrainJob",
           "metadata": {"name": "j", "namespace": "ns", "uid": "u1"}}
    points = add_point([], {"iteration": 5, "loss": 2.5, "tokensPerSecond": 10.0}, "2026-01-01T00:00:00Z")
    cm = config_map(job, points)
    assert cm["metadata"]["name"] == "j-history" and cm["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert read(cm) == [{"iteration": 5, "time": "2026-01-01T00:00:00Z", "loss": 2.5, "tokensPerSecond": 10.0}]


def test_stage_figures_join_the_series():
    points = add_point([], {"iteration": 3, "loss": 0.4, "rewardMean": 0.25, "accuracy": 0.5,
                            "rewardAccuracy": None}, "t")
    assert points == [{"iteration": 3, "time": "t", "loss": 0.4, "rewardMean": 0.25, "accuracy": 0.5}]
    prm = add_point([], {"iteration": 4, "loss": 0.3, "stepAccuracy": 0.75}, "t")
    assert prm == [{"iteration": 4, "time": "t", "loss": 0.3, "stepAccuracy": 0.75}]
