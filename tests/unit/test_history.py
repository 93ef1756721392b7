"""The curve history: every logged iteration kept up to a bound, then thinned by buckets that keep each bucket's
min, max and last point; the engine's series merged into the operator's ConfigMap; restarts replace the tail."""
import math
import random
import urllib.request

from ascend_engine.series import MAX_POINTS, add_point, downsample, merge
from ascend_engine.telemetry import SERIES_PATH, Metrics
from ascend_operator.progress.history import config_map, read, record


def _run(n: int, loss=lambda i: 10.0 / i) -> list:
    points: list = []
    for iteration in range(1, n + 1):
        points = add_point(points, iteration, {"loss": loss(iteration), "learningRate": 3e-4}, "t") or points
    return points


def test_a_short_run_keeps_every_logged_iteration():
    points = _run(MAX_POINTS)
    assert [p["iteration"] for p in points] == list(range(1, MAX_POINTS + 1))
    assert add_point(points, MAX_POINTS, {"loss": 10.0 / MAX_POINTS}, "t2") is None  # nothing new
    assert add_point(points, MAX_POINTS + 1, {"iteration": 7}, "t") is None  # no figures yet


def test_a_long_run_is_thinned_by_buckets_keeping_extremes_the_newest_point_and_the_shape():
    rng = random.Random(0)
    spikes = {1234: 50.0, 7777: 0.001}  # a loss spike and a dip must survive thinning

    def loss(i):
        return spikes.get(i, 5.0 * math.exp(-i / 3000) + rng.uniform(0, 0.1))

    points = _run(10_000, loss)
    iterations = [p["iteration"] for p in points]
    assert len(points) <= MAX_POINTS and iterations == sorted(iterations) and iterations[-1] == 10_000
    assert 1234 in iterations and 7777 in iterations and iterations[0] == 1
    losses = [p["loss"] for p in points]
    assert max(losses) == 50.0 and min(losses) == 0.001
    # the shape: the kept curve falls as the run did (first tenth above the last tenth)
    tenth = len(points) // 10
    assert sum(losses[:tenth]) / tenth > sum(losses[-tenth:]) / tenth + 2


def test_downsample_returns_logged_points_only():
    points = [{"iteration": i, "time": "t", "loss": float(i % 7)} for i in range(5000)]
    thinned = downsample(points, 100)
    assert len(thinned) <= 100 and all(p in points for p in thinned) and thinned[-1] == points[-1]


def test_a_gang_restart_from_an_older_checkpoint_replaces_the_abandoned_tail():
    points = []
    for iteration in (10, 20, 30):
        points = add_point(points, iteration, {"loss": 1.0}, "t")
    points = add_point(points, 25, {"loss": 0.9}, "t")
    assert [p["iteration"] for p in points] == [10, 20, 25]
    assert [p["iteration"] for p in merge(points, [{"iteration": 21, "loss": 2.0}])] == [10, 20, 21]


def test_validation_loss_joins_its_step():
    points = add_point([], 5, {"loss": 2.0}, "t")
    points = add_point(points, 5, {"validationLoss": 2.2}, "t")
    assert points == [{"iteration": 5, "time": "t", "loss": 2.0, "validationLoss": 2.2}]


def test_the_engines_exact_figures_replace_a_rounded_scrape_of_the_same_iteration():
    scraped = add_point([], 30, {"loss": 1.5501}, "t")
    assert add_point(scraped, 30, {"loss": 1.5500773191452026}, "t2") is None  # another scrape: kept
    assert add_point(scraped, 30, {"loss": 1.5500773191452026, "learningRate": 0.0}, "t2", exact=True) == \
        [{"iteration": 30, "time": "t", "loss": 1.5500773191452026, "learningRate": 0.0}]


class _Kube:
    def __init__(self):
        self.maps = {}

    def get_config_map(self, namespace, name):
        return self.maps.get((namespace, name))

    def update_config_map(self, namespace, body):
        self.maps[(namespace, body["metadata"]["name"])] = body


JOB = {"apiVersion": "ascendtrain.dev/v1alpha1", "kind": "AscendTrainJob",
       "metadata": {"name": "j", "namespace": "ns", "uid": "u1"}}


def test_the_engine_series_served_by_rank_0_lands_whole_in_the_owned_config_map():
    """Two scrapes 6 iterations apart: every iteration in between is in the history, not just the scraped ones."""
    metrics, kube = Metrics(), _Kube()
    metrics.serve(0, "127.0.0.1")  # port 0: any free port
    port = metrics.server.server_address[1]
    url = f"http://127.0.0.1:{port}{SERIES_PATH}"
    from ascend_operator.progress.scrape import scrape_series

    for i in range(1, 4):
        metrics.set(iteration=i, loss=5.0 - i, learningRate=1e-3)
    record(kube, JOB, {"iteration": 3, "loss": 2.0}, "t", scrape_series(f"http://127.0.0.1:{port}", 0))
    for i in range(4, 10):
        metrics.set(iteration=i, loss=5.0 - i * 0.4, learningRate=1e-3)
    metrics.set(validationLoss=1.5)
    record(kube, JOB, {"iteration": 8, "loss": 1.8}, "t", scrape_series(f"http://127.0.0.1:{port}", 0))
    cm = kube.maps[("ns", "j-history")]
    assert cm["metadata"]["ownerReferences"][0]["uid"] == "u1"
    points = read(cm)
    assert [p["iteration"] for p in points] == list(range(1, 10))
    assert points[-1]["validationLoss"] == 1.5 and points[2]["loss"] == 2.0
    assert urllib.request.urlopen(url).status == 200
    metrics.server.shutdown()


def test_the_series_round_trips_through_an_owned_config_map():
    points = add_point([], 5, {"loss": 2.5, "tokensPerSecond": 10.0}, "2026-01-01T00:00:00Z")
    cm = config_map(JOB, points)
    assert cm["metadata"]["name"] == "j-history" and cm["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert read(cm) == [{"iteration": 5, "time": "2026-01-01T00:00:00Z", "loss": 2.5, "tokensPerSecond": 10.0}]


def test_stage_figures_join_the_series():
    points = add_point([], 3, {"loss": 0.4, "rewardMean": 0.25, "accuracy": 0.5, "rewardAccuracy": None}, "t")
    assert points == [{"iteration": 3, "time": "t", "loss": 0.4, "rewardMean": 0.25, "accuracy": 0.5}]
