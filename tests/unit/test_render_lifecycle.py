"""What the lifecycle renders: wait-for-master on workers, resume from save, gang PodGroups, host ports."""
import yaml

from ascend_operator.api.train_job import AscendTrainJobSpec
from ascend_operator.render import host_ports
from ascend_operator.render import train_job as render


def _spec(**overrides):
    base = {"image": "engine:1", "nnodes": 4, "nprocPerNode": 1, "train": {}}
    base.update(overrides)
    base["train"] = {"training": {"globalBatchSize": 8}, **base["train"]}
    return AscendTrainJobSpec.model_validate(base)


def test_workers_wait_for_the_master_then_run_torchrun():
    spec = _spec(masterWaitSeconds=90)
    master, worker = render.pod("j", "ns", spec, 0), render.pod("j", "ns", spec, 1)
    assert master["spec"]["containers"][0]["command"][:3] == ["python3", "-m", "ascend_engine.launcher"]
    command = worker["spec"]["containers"][0]["command"]
    assert command[:6] == ["ascend-engine", "wait-for-master", "--addr=$(MASTER_ADDR)", "--port=$(MASTER_PORT)",
                           "--timeout=90", "--"]
    master_command = master["spec"]["containers"][0]["command"]
    # in-place restarts (the default): a c10d rendezvous that pod 0 alone hosts, on masterPort
    assert command[6:] == [a.replace("is_host=1", "is_host=0") for a in master_command]
    assert {"--rdzv-backend=c10d", "--rdzv-endpoint=$(MASTER_ADDR):$(MASTER_PORT)", "--rdzv-id=j",
            "--rdzv-conf=is_host=1", "--local-addr=$(POD_IP)", "--max-restarts=3"} <= set(master_command)
    env = {e["name"]: e.get("value") for e in master["spec"]["containers"][0]["env"]}
    assert (env["ASCEND_INPROCESS_RESTARTS"], env["ASCEND_WARM_SPARES"], env["ASCEND_MEMORY_CHECKPOINT"]) == \
        ("3", "1", "1")  # the in-process level's defaults, read by the launcher
    # in-process restarts alone still need the c10d rendezvous: its store coordinates the ranks
    in_process = render.pod("j", "ns", _spec(runPolicy={"recovery": {"inPlaceRestarts": 0}}), 0)
    assert {"--rdzv-backend=c10d", "--max-restarts=0"} <= set(in_process["spec"]["containers"][0]["command"])
    static = render.pod("j", "ns", _spec(runPolicy={"recovery": {"inPlaceRestarts": 0, "inProcessRestarts": 0}}), 1)
    assert {"--master-addr=$(MASTER_ADDR)", "--master-port=$(MASTER_PORT)", "--node-rank=$(NODE_RANK)"} <= \
        set(static["spec"]["containers"][0]["command"])
    assert not any(a.startswith("--rdzv") for a in static["spec"]["containers"][0]["command"])


def test_load_defaults_to_save_so_restarts_resume():
    config = lambda spec: yaml.safe_load(render.engine_config_map("j", spec)["data"]["config.yaml"])  # noqa: E731
    assert config(_spec(train={"checkpoint": {"save": "/ckpt"}}))["checkpoint"]["load"] == "/ckpt"
    assert config(_spec(train={"checkpoint": {"save": "/ckpt", "load": "/base"}}))["checkpoint"]["load"] == "/base"
    assert "load" not in config(_spec())["checkpoint"]


def test_volcano_gang_scheduling():
    spec = _spec(gangScheduling="volcano", volcanoQueue="research", priorityClassName="high")
    objects = render.objects("j", "ns", spec)
    [group] = [o for o in objects if o["kind"] == "PodGroup"]
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["spec"] == {"minMember": 4, "queue": "research", "priorityClassName": "high"}
    pods = [o for o in objects if o["kind"] == "Pod"]
    assert [o["kind"] for o in objects].index("PodGroup") < [o["kind"] for o in objects].index("Pod")
    for p in pods:
        assert p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "j"
        assert p["spec"]["schedulerName"] == "volcano"


def test_coscheduling_gang_scheduling_keeps_the_chosen_scheduler():
    spec = _spec(gangScheduling="coscheduling", schedulerName="scheduler-plugins-scheduler")
    objects = render.objects("j", "ns", spec)
    [group] = [o for o in objects if o["kind"] == "PodGroup"]
    assert group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1" and group["spec"] == {"minMember": 4}
    for p in (o for o in objects if o["kind"] == "Pod"):
        assert p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "j"
        assert p["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    assert not any(o["kind"] == "PodGroup" for o in render.objects("j", "ns", _spec()))


def test_host_network_pods_and_port_blocks_never_overlap():
    pod = render.pod("j", "ns", _spec(hostNetwork=True), 0)
    assert pod["spec"]["hostNetwork"] is True and pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    blocks = host_ports.blocks_in(40000, 49999, 64)
    taken: set[int] = set()
    for i in range(blocks):  # every job gets a block of its own until the range is full
        taken.add(host_ports.choose_block(f"uid-{i}", taken, blocks))
    assert len(taken) == blocks
    first, second = host_ports.ports(0, 40000, 64), host_ports.ports(1, 40000, 64)
    assert first == {"block": 0, "masterPort": 40000, "metricsPort": 40001, "hcclIfBasePort": 40016}
    assert second["masterPort"] == 40064 > first["hcclIfBasePort"]
    # Stable: the same uid asks for the same block after an operator restart.
    assert host_ports.choose_block("abc", set(), blocks) == host_ports.choose_block("abc", set(), blocks)


def test_pipeline_example_validates_against_the_models():
    from pathlib import Path

    from ascend_operator.api.resources import RESOURCES
    from ascend_operator.lifecycle.dependencies import refs

    docs = list(yaml.safe_load_all((Path(__file__).resolve().parents[2] / "examples" / "pipeline.yaml").read_text()))
    assert docs[0]["kind"] == "PersistentVolumeClaim"  # the workspace every stage mounts
    docs = docs[1:]
    specs = {d["metadata"]["name"]: RESOURCES[d["kind"]].spec.model_validate(d["spec"]) for d in docs}
    assert [d["kind"] for d in docs] == ["DatasetPrep", "CheckpointConvert", "AscendTrainJob", "CheckpointConvert"]
    named = {name: [(r.kind.kind, r.name) for r in refs(spec)] for name, spec in specs.items()}
    assert named["sft"] == [("DatasetPrep", "alpaca-prep"), ("CheckpointConvert", "qwen3-hf2mcore")]
    assert named["qwen3-mcore2hf"] == [("AscendTrainJob", "sft")]
