"""What a large job asks of the API server fits Kubernetes' object limits whatever the job's size: no object
holds a per-node list (no rank table: HCCL bootstraps through torchrun's store at the headless Service's rank 0),
and the status names counts and a few objects, not every pod."""
import json

from ascend_operator.api.train_job import AscendTrainJobSpec
from ascend_operator.lifecycle.pod_calls import summarize
from ascend_operator.render import train_job as render

CONFIG_MAP_LIMIT = 1024 * 1024  # a ConfigMap's data, and etcd's 1.5 MiB request limit for any object


def objects(nnodes: int) -> list[dict]:
    spec = AscendTrainJobSpec.model_validate({"image": "engine:1", "nnodes": nnodes,
                                              "train": {"training": {"globalBatchSize": nnodes}}})
    return render.objects("big", "default", spec)


def sizes(objs: list[dict]) -> dict[str, int]:
    """Largest JSON size by kind."""
    out: dict[str, int] = {}
    for o in objs:
        out[o["kind"]] = max(out.get(o["kind"], 0), len(json.dumps(o)))
    return out


def test_no_object_grows_with_the_number_of_nodes_at_512():
    small, large = objects(2), objects(512)
    assert sum(o["kind"] == "Pod" for o in large) == 512
    big, little = sizes(large), sizes(small)
    assert set(big) == set(little)  # no extra object (rank table ConfigMap) appears at scale
    for kind, size in big.items():
        assert size < CONFIG_MAP_LIMIT, kind
        assert size - little[kind] < 64, f"{kind} grows with the job: {little[kind]} -> {size} bytes"
    rank = large[-1]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in rank["env"]}
    assert env["NODE_RANK"] == "511" and env["NNODES"] == "512"
    assert env["MASTER_ADDR"].startswith("big-0.") and "HCCL_CONNECT_TIMEOUT" in env
    assert not any("RANK_TABLE" in name for name in env)


def test_the_created_condition_names_counts_and_a_few_objects():
    names = ["Service/big", "ConfigMap/big-config"] + [f"Pod/big-{i}" for i in range(4096)]
    text = summarize(names)
    assert text == "Service/big, ConfigMap/big-config, 4096 Pods (big-0, big-1, ..., big-4095)"
    assert summarize(["Pod/a-0", "Pod/a-1"]) == "Pod/a-0, Pod/a-1"
