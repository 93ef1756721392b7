"""A bring-your-own trainer: the spec admits exactly one of train / trainer (the model offline; the CRD's CEL rule
is judged by kube-apiserver in tests/operator), its
pods get the engine's torchrun contract around the user's command, and ``ascend-engine watch`` turns Megatron-LM's
exact iteration lines into the engine's metrics while passing exit codes and signals through."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import yaml
from pydantic import ValidationError

from ascend_engine.megatron_log import MegatronLogReader, seq_length_from_argv
from ascend_operator.api.train_job import AscendTrainJobSpec
from ascend_operator.progress.scrape import scrape
from ascend_operator.render import train_job as render
from ascend_operator.validation import validate_text

TRAINER = {"command": ["torchrun", "pretrain_gpt.py"], "args": ["--seq-length", "4096"]}


def _job(**spec):
    return {"apiVersion": "ascendtrain.dev/v1alpha1", "kind": "AscendTrainJob", "metadata": {"name": "mega"},
            "spec": {"image": "my/megatron:1", "nnodes": 2, "nprocPerNode": 8, **spec}}


def test_train_and_trainer_exclude_each_other_in_the_crd_and_the_model():
    # A batch valid for 2 x 8 ranks, so the exclusion is the only problem.
    both = _job(trainer=TRAINER, train={"model": {"numLayers": 2}, "training": {"globalBatchSize": 16}})
    problems = validate_text(yaml.safe_dump(both), "job.yaml")[1]
    assert [(p.field, p.message) for p in problems] == [
        ("spec", "train and trainer exclude each other: train runs the engine, trainer runs your own command")]
    with pytest.raises(ValidationError, match="train and trainer exclude each other"):
        AscendTrainJobSpec.model_validate(both["spec"])
    with_eval = _job(trainer=TRAINER, evaluation={"load": "/ckpt", "task": ["mmlu"], "taskDataPath": ["/data"],
                                                        "tokenizerNameOrPath": "/tok"})
    assert "evaluation, datasetPrepRef and checkpointConvertRef feed the engine" in \
        str(validate_text(yaml.safe_dump(with_eval), "job.yaml")[1])
    assert validate_text(yaml.safe_dump(_job(trainer=TRAINER)), "job.yaml")[1] == []
    assert validate_text(yaml.safe_dump(_job(trainer={"command": []})), "job.yaml")[1]  # a command is required


def test_byo_pods_get_the_torchrun_contract_around_the_users_command():
    spec = AscendTrainJobSpec.model_validate(_job(trainer={**TRAINER, "workingDir": "/megatron"})["spec"])
    objects = render.objects("mega", "team", spec)
    pods = [o for o in objects if o["kind"] == "Pod"]
    assert [p["metadata"]["name"] for p in pods] == ["mega-0", "mega-1"]
    first, second = (p["spec"]["containers"][0] for p in pods)
    assert first["command"] == ["ascend-engine", "watch", "--", "torchrun", "pretrain_gpt.py", "--seq-length", "4096"]
    assert second["command"][:2] == ["ascend-engine", "wait-for-master"]
    assert second["command"][-5:] == ["--", *first["command"]][-5:] and "watch" in second["command"]
    assert first["workingDir"] == "/megatron" and first["image"] == "my/megatron:1"
    env = {e["name"]: e.get("value") for e in second["env"]}
    assert env["PET_NNODES"] == "2" and env["PET_NODE_RANK"] == "1" and env["PET_NPROC_PER_NODE"] == "8"
    assert env["PET_MASTER_ADDR"] == "mega-0.mega.team.svc" and env["ASCEND_METRICS_PORT"] == "9400"
    assert env["HCCL_CONNECT_TIMEOUT"] == "1200" and env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "885"
    assert first["resources"]["limits"]["huawei.com/Ascend910"] == "8"
    assert first["terminationMessagePolicy"] == "FallbackToLogsOnError"
    plain = AscendTrainJobSpec.model_validate(_job(trainer={**TRAINER, "progress": "none"})["spec"])
    assert render.pod("mega", "team", plain, 1)["spec"]["containers"][0]["command"] == \
        ["torchrun", "pretrain_gpt.py", "--seq-length", "4096"]


def megatron_line(iteration: int, total: int, lr: float, loss: float, ms: float = 250.0, batch: int = 8) -> str:
    """Megatron-LM core_v0.12.1's training_log line, field by field as it formats them."""
    line = " [2025-06-01 10:00:00]"
    line += " iteration {:8d}/{:8d} |".format(iteration, total)
    line += " consumed samples: {:12d} |".format(iteration * batch)
    line += " elapsed time per iteration (ms): {:.1f} |".format(ms)
    line += f" learning rate: {lr:.6E} |"
    line += f" global batch size: {batch:5d} |"
    line += " {}: {:.6E} |".format("lm loss", loss)
    line += " loss scale: 1.0 | grad norm: 2.345 |"
    line += " number of skipped iterations: {:3d} | number of nan iterations: {:3d} |".format(0, 0)
    return line


def test_megatron_lines_become_progress_fields():
    reader = MegatronLogReader(seq_length=seq_length_from_argv(["torchrun", "x.py", "--seq-length", "1024"]))
    assert reader.feed(megatron_line(10, 100, 1.5e-4, 7.25))
    assert reader.figures == {"iteration": 10, "trainIters": 100, "percent": 10.0, "loss": 7.25,
                              "learningRate": 1.5e-4, "tokensPerSecond": 8 * 1024 / 0.25, "etaSeconds": 22.5}
    assert reader.feed(" validation loss at iteration 10 | lm loss value: 7.100000E+00 | lm loss PPL: 1.2E+03 | ")
    assert reader.feed("  successfully saved checkpoint from iteration      10 to /ckpt [ t 1/2, p 1/1 ]")
    assert reader.figures["validationLoss"] == 7.1 and reader.figures["lastCheckpointIteration"] == 10
    assert not reader.feed("building GPT model ...")
    dumped = MegatronLogReader()  # without --seq-length on the command, Megatron's argument dump gives it
    dumped.feed("  seq_length ...................................... 64")
    dumped.feed(megatron_line(1, 2, 1e-4, 9.0, ms=1000.0))
    assert dumped.figures["tokensPerSecond"] == 8 * 64
    assert seq_length_from_argv(["bash", "-c", "torchrun p.py --seq-length=2048 --foo"]) == 2048


TRAINER_SCRIPT = textwrap.dedent("""
    import signal, sys, time
    signal.signal(signal.SIGTERM, lambda *_: (print("trainer got SIGTERM", flush=True), sys.exit(7)))
    print(sys.argv[1], flush=True)
    print("warning on stderr", file=sys.stderr, flush=True)
    if sys.argv[2] == "fail":
        raise FileNotFoundError("no such dataset: /data/missing_text_document.bin")
    time.sleep(float(sys.argv[2]))
""")


def _watch(tmp_path, *args, port=None):
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER_SCRIPT)
    env = {**os.environ, "ASCEND_TERMINATION_LOG": str(tmp_path / "termination-log"), "POD_IP": "127.0.0.1"}
    if port:
        env["ASCEND_METRICS_PORT"] = str(port)
    return subprocess.Popen([sys.executable, "-m", "ascend_engine.cli", "watch", "--", sys.executable, str(script),
                             *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_watch_serves_the_lines_as_metrics_and_keeps_exit_code_and_output(tmp_path):
    port = _free_port()
    proc = _watch(tmp_path, megatron_line(3, 9, 2e-4, 6.5), "30", port=port)
    deadline, figures = time.monotonic() + 30, None
    while time.monotonic() < deadline and not (figures := scrape(f"http://127.0.0.1:{port}/metrics")):
        time.sleep(0.2)
    assert figures == {"iteration": 3, "trainIters": 9, "percent": 33.333, "loss": 6.5, "learningRate": 0.0002,
                       "etaSeconds": 1.5}
    proc.send_signal(signal.SIGTERM)  # passed to the trainer, whose own exit code comes back
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 7
    assert out.splitlines() == [megatron_line(3, 9, 2e-4, 6.5), "trainer got SIGTERM"]
    assert "warning on stderr" in err
    report = json.loads((tmp_path / "termination-log").read_text())
    assert report["status"] == "Failed"


def test_watch_reports_final_figures_or_the_trainers_own_error(tmp_path):
    ok = _watch(tmp_path, megatron_line(9, 9, 1e-4, 3.0), "0")
    ok.communicate(timeout=30)
    assert ok.returncode == 0
    assert json.loads((tmp_path / "termination-log").read_text())["iteration"] == 9
    failed = _watch(tmp_path, "starting", "fail")
    failed.communicate(timeout=30)
    assert failed.returncode == 1
    assert json.loads((tmp_path / "termination-log").read_text()) == {
        "status": "Failed", "reason": "TrainerFailed",
        "message": "FileNotFoundError: no such dataset: /data/missing_text_document.bin"}
    missing = subprocess.run([sys.executable, "-m", "ascend_engine.cli", "watch", "--", "no-such-trainer"],
                             capture_output=True, text=True)
    assert missing.returncode == 127 and "cannot start no-such-trainer" in missing.stderr
