"""The pods an AscendTrainJob renders follow torchrun's and Kubeflow's environment contract."""
import yaml

from ascend_operator.api.train_job import AscendTrainJobSpec
from ascend_operator.render import train_job as render


def _spec(**overrides):
    spec = {"image": "engine:1", "nnodes": 2, "nprocPerNode": 8,
            "train": {"model": {"numLayers": 8},
                      "parallel": {"tensorModelParallelSize": 2, "pipelineModelParallelSize": 4}}}
    spec.update(overrides)
    return AscendTrainJobSpec.model_validate(spec)


def _env(pod):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def test_every_pod_gets_the_torchrun_contract():
    spec = _spec()
    pods = [render.pod("llm", "team-a", spec, i) for i in range(spec.nnodes)]
    assert [p["metadata"]["name"] for p in pods] == ["llm-0", "llm-1"]
    for index, pod in enumerate(pods):
        env = _env(pod)
        assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == "llm-0.llm.team-a.svc"
        assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == "29500"
        assert env["NNODES"] == env["PET_NNODES"] == "2"
        assert env["NODE_RANK"] == env["PET_NODE_RANK"] == str(index)
        assert env["NPROC_PER_NODE"] == env["PET_NPROC_PER_NODE"] == "8"
        assert env["WORLD_SIZE"] == "16"
        assert env["HCCL_CONNECT_TIMEOUT"] == "1200"
        assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert pod["spec"]["hostname"] == f"llm-{index}" and pod["spec"]["subdomain"] == "llm"
        assert pod["metadata"]["labels"]["ascendtrain.dev/replica-index"] == str(index)
        assert pod["metadata"]["labels"]["ascendtrain.dev/job-name"] == "llm"
        assert pod["metadata"]["labels"]["ring-controller.atlas"] == "ascend-910b"
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits["huawei.com/Ascend910"] == "8"
        assert pod["spec"]["containers"][0]["resources"]["requests"]["huawei.com/Ascend910"] == "8"
        assert pod["spec"]["restartPolicy"] == "Never"
        command = pod["spec"]["containers"][0]["command"]
        if index:  # workers wait for the master's address before starting torchrun
            assert command[:2] == ["ascend-engine", "wait-for-master"]
            command = command[command.index("--") + 1:]
        assert command[:3] == ["python3", "-m", "ascend_engine.launcher"] and "--rdzv-backend=c10d" in command
        assert command[command.index("-m", 3) + 1] == "ascend_engine"


def test_cpu_and_gpu_devices():
    cpu = render.pod("j", "ns", _spec(devices={"resource": "none"}), 0)
    assert "limits" not in cpu["spec"]["containers"][0]["resources"]
    assert "ring-controller.atlas" not in cpu["metadata"]["labels"]
    assert "HCCL_CONNECT_TIMEOUT" not in _env(cpu)
    gpu = render.pod("j", "ns", _spec(devices={"resource": "nvidia.com/gpu", "ringController": ""}), 1)
    assert gpu["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}


def test_cpu_limit_sets_the_thread_count_per_process():
    """torch would start a thread per core of the node in every process; the container's CPU share decides."""
    def threads(**overrides):
        pod = render.pod("j", "ns", _spec(devices={"resource": "none"}, **overrides), 0)
        return [e.get("value") for e in pod["spec"]["containers"][0]["env"] if e["name"] == "OMP_NUM_THREADS"]

    assert threads(resources={"limits": {"cpu": "16"}}) == ["2"]  # 8 processes share 16 cores
    assert threads(resources={"requests": {"cpu": "500m"}}) == ["1"]  # never 0
    assert threads(resources={"limits": {"cpu": "4"}}, env=[{"name": "OMP_NUM_THREADS", "value": "3"}]) == ["3"]
    assert threads() == []  # no CPU figure: torch's own default


def test_headless_service_and_config_map():
    spec = _spec()
    objects = render.objects("llm", "ns", spec)
    assert [o["kind"] for o in objects] == ["Service", "ConfigMap", "Pod", "Pod"]
    service = objects[0]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"]
    config = yaml.safe_load(objects[1]["data"]["config.yaml"])
    assert config["parallel"]["tensorModelParallelSize"] == 2
    assert config["parallel"]["pipelineModelParallelSize"] == 4
    mounts = {m["mountPath"] for m in objects[2]["spec"]["containers"][0]["volumeMounts"]}
    assert {"/etc/ascendtrain", "/dev/shm"} <= mounts


def test_user_settings_pass_through():
    spec = _spec(env=[{"name": "ASCEND_RT_VISIBLE_DEVICES", "value": "0,1"}], schedulerName="volcano",
                 nodeSelector={"accelerator": "910b"}, tolerations=[{"key": "npu", "operator": "Exists"}],
                 hccl={"socketIfname": "eth0", "ifBasePort": 60000})
    pod = render.pod("j", "ns", spec, 0)
    env = _env(pod)
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "0,1"
    assert env["HCCL_SOCKET_IFNAME"] == "eth0" and env["HCCL_IF_BASE_PORT"] == "60000"
    assert pod["spec"]["schedulerName"] == "volcano"
    assert pod["spec"]["nodeSelector"] == {"accelerator": "910b"}
    assert pod["spec"]["tolerations"] == [{"key": "npu", "operator": "Exists"}]
