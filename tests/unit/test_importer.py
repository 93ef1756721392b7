"""``ascend-engine import-script`` on launch scripts written like the seeds' (tests/unit/fixtures/scripts):
the manifests validate against the AscendTrainJob model (and kube-apiserver, with the CRD, accepts them as
written: tests/operator/test_manifests_on_the_server.py), and every flag of the launch is either imported at its
field or named as not imported."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import yaml

from ascend_engine.cli import main as engine_main
from ascend_engine.config.loader import ConfigError, build_config, iter_flag_fields
from ascend_engine.config.train import TrainConfig
from ascend_engine.importer.job import import_script
from ascend_engine.importer.launch import find_launch
from ascend_engine.importer.shell import read_script
from ascend_operator.api.resources import RESOURCES
from ascend_operator.api.train_job import AscendTrainJobSpec

SCRIPTS = Path(__file__).parent / "fixtures" / "scripts"
FIXTURES = sorted(p.name for p in SCRIPTS.glob("*.sh"))
# The train command's aliases (train/command.py): flags that set a field without being its Flag.
ALIASES = {"--bf16": ("training", "precision"), "--fp16": ("training", "precision")}


def imported(script: str, **kw):
    path = SCRIPTS / script
    return import_script(path.read_text(), str(path), **kw)


def _at(data: dict, path: tuple[str, ...]):
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return KeyError
        data = data[key]
    return data


@pytest.mark.parametrize("name", FIXTURES)
def test_every_seed_script_becomes_a_valid_resource(name):
    job = imported(name)
    manifest = job.manifest
    assert manifest["apiVersion"] == "ascendtrain.dev/v1alpha1" and manifest["kind"] == "AscendTrainJob"
    AscendTrainJobSpec.model_validate(manifest["spec"])
    assert manifest["metadata"]["name"] == Path(name).stem.lower().replace("_", "-")
    assert job.gaps == []  # model shape, data and device count all resolved from the script's own variables


@pytest.mark.parametrize("name", FIXTURES)
def test_every_flag_is_imported_or_named(name):
    job = imported(name)
    launch, _ = find_launch(read_script((SCRIPTS / name).read_text()))
    fields = {n: path for path, _, flag in iter_flag_fields(TrainConfig) for n in flag.names} | ALIASES
    skipped = {s.flag for s in job.skipped} | {w.split()[0] for w in job.no_effect}
    train = job.manifest["spec"]["train"]
    for flag, _values in launch.flags:
        if flag in skipped:
            continue
        assert flag in fields, f"{flag} neither imported nor reported"
        assert _at(train, fields[flag]) is not KeyError, f"{flag} reported as imported but not in spec.train"
    assert not skipped & {f for f in fields if _at(train, fields[f]) is not KeyError and f not in ALIASES}


def test_qwen3_1point7b_pretrain_from_seed_002():
    job = imported("pretrain_qwen3_1point7b_4K_ptd.sh")
    spec = job.manifest["spec"]
    train = spec["train"]
    assert (spec["nnodes"], spec["nprocPerNode"], spec["masterPort"]) == (1, 2, 6000)
    assert train["parallel"] == {"tensorModelParallelSize": 1, "pipelineModelParallelSize": 2,
                                 "useDistributedOptimizer": True}
    assert train["training"] == {"microBatchSize": 1, "globalBatchSize": 32, "seqLength": 4096,
                                 "trainIters": 2000, "seed": 42, "precision": "bf16",
                                 "evalInterval": 2000, "evalIters": 0}  # --eval-iters 0: no validation
    assert train["model"]["numLayers"] == 28 and train["model"]["numQueryGroups"] == 8
    assert train["model"]["maxPositionEmbeddings"] == 4096 and train["model"]["rotaryBase"] == 1e6
    assert train["data"] == {"dataPath": ["/fuyuxin/dataset/enwiki_text_document"], "split": "100,0,0",
                             "tokenizerNameOrPath": "/model/Qwen3-1point7B"}
    assert train["checkpoint"] == {"load": "/fuyuxin/ckpt/ckpt-qwen3-1point7b", "save": "/workspace/model-out",
                                   "saveInterval": 2000, "loadOptim": False, "loadRng": False}
    assert spec["hccl"] == {"connectTimeout": 1800}
    assert spec["env"] == [{"name": "CUDA_DEVICE_MAX_CONNECTIONS", "value": "1"},
                           {"name": "NPU_ASD_ENABLE", "value": "0"}]
    skipped = {s.flag: s.values for s in job.skipped}
    assert skipped["--spec"] == ["mindspeed_llm.tasks.models.spec.qwen3_spec", "layer_spec"]
    assert {"--use-flash-attn", "--distributed-backend nccl"} <= set(job.no_effect)  # speed, not results
    assert "/fuyuxin/dataset/enwiki_text_document" in job.paths and "/model/Qwen3-1point7B" in job.paths


def test_qwen3_14b_full_sft_tp2_pp4_from_seed_003():
    job = imported("tune_qwen3_14b_4K_full_alpaca_ptd.sh")
    spec = job.manifest["spec"]
    train = spec["train"]
    assert (spec["nnodes"], spec["nprocPerNode"], spec["masterPort"]) == (1, 8, 6015)
    assert train["parallel"]["tensorModelParallelSize"] == 2 and train["parallel"]["pipelineModelParallelSize"] == 4
    assert train["checkpoint"]["finetune"] is True
    assert train["data"]["dataPath"] == ["/apps/hw/outputs/qwen3/finetune_dataset_alpaca/alpaca"]
    assert TrainConfig.model_validate(train).check_world_size(8) == 1
    assert {"--stage", "--prompt-type", "--is-instruction-dataset"} <= {s.flag for s in job.skipped} | \
        _imported_flags(train)


def _imported_flags(train: dict) -> set[str]:
    return {n for path, _, flag in iter_flag_fields(TrainConfig) for n in flag.names
            if _at(train, path) is not KeyError}


def test_multi_node_script_keeps_shape_and_leaves_rank_to_the_operator():
    job = imported("pretrain_qwen3_14b_4K_2nodes_ptd.sh")
    spec = job.manifest["spec"]
    assert (spec["nnodes"], spec["nprocPerNode"]) == (2, 8)
    assert spec["hccl"] == {"ifBasePort": 30000, "connectTimeout": 1800, "socketIfname": "enp189s0f0"}
    assert any("--node-rank current node id: set per pod by the operator" in n for n in job.notes)
    assert any("--master-addr your master node IP" in n for n in job.notes)
    assert spec["train"]["observability"]["tensorboardDir"] == "/apps/hw/outputs/qwen3/14b/tb/pretrain"
    assert {"--context-parallel-size", "--no-shared-storage"} <= {s.flag for s in job.skipped}


def test_presets_override_the_scripts_variables():
    job = imported("pretrain_qwen3_1point7b_4K_ptd.sh", preset={"NPUS_PER_NODE": "4", "GBS": "64"},
                   name="qwen3-pretrain", namespace="research", image="registry.example/engine:1")
    assert job.manifest["metadata"] == {"name": "qwen3-pretrain", "namespace": "research"}
    spec = job.manifest["spec"]
    assert spec["nprocPerNode"] == 4 and spec["train"]["training"]["globalBatchSize"] == 64
    assert spec["image"] == "registry.example/engine:1"


def test_shell_evaluation_follows_bash():
    script = read_script(
        'A=1\nB="x#y $A"  # comment\nC=\'$A lit\'\nD=${UNSET:-fallback}\nE=$(( ($A + 3) * 2 / 4 ))\n'
        'F="\n  --one $A \\\n  --two\n"\nexport G=$B\nrun $F "$B" x${A}y \\\n  --tail $(hostname) 2>&1 > log\n'
        'H=2 && echo ok; echo two | tee out\n', preset={"A": "7"})
    v = script.variables
    assert (v["A"], v["B"], v["C"], v["D"], v["E"]) == ("7", "x#y 7", "$A lit", "fallback", "5")
    assert script.exported == ["G"] and v["G"] == "x#y 7"
    words = [c.words for c in script.commands]
    assert words[0] == ["run", "--one", "7", "--two", "x#y 7", "x7y", "--tail", "$(hostname)"]
    assert words[1:] == [["echo", "ok"], ["echo", "two"], ["tee", "out"]]
    assert any("$(hostname)" in w for w in script.warnings)


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "tune_bad.sh"
    path.write_text(body)
    return path


BASE = ("NPUS_PER_NODE={npus}\nTP={tp}\nPP=1\nGPT_ARGS=\"--num-layers 4 --hidden-size 64 --num-attention-heads 4 "
        "--tensor-model-parallel-size $TP --pipeline-model-parallel-size $PP {extra}\"\n"
        "torchrun --nproc_per_node $NPUS_PER_NODE pretrain_gpt.py $GPT_ARGS --global-batch-size 8\n")


def test_a_bad_value_is_reported_against_its_flag(tmp_path):
    path = _write(tmp_path, BASE.format(npus=2, tp=2, extra="--lr-decay-style weird --seq-length many"))
    job = import_script(path.read_text(), str(path))
    reasons = {s.flag: s.reason for s in job.skipped}
    assert "invalid choice: 'weird'" in reasons["--lr-decay-style"]
    assert reasons["--seq-length"].startswith("training.seqLength: Input should be a valid integer")
    assert job.manifest["spec"]["train"]["parallel"]["tensorModelParallelSize"] == 2


def test_an_inconsistent_script_fails_naming_file_and_field(tmp_path):
    path = _write(tmp_path, BASE.format(npus=3, tp=3, extra=""))
    with pytest.raises(ConfigError) as err:
        import_script(path.read_text(), str(path))
    assert f"{path}:5: train" in str(err.value) and "tensorModelParallelSize (3) must divide" in str(err.value)
    path = _write(tmp_path, BASE.format(npus=3, tp=2, extra=""))
    with pytest.raises(ConfigError) as err:
        import_script(path.read_text(), str(path))
    assert f"{path}:5: spec" in str(err.value) and "nnodes x nprocPerNode (1 x 3)" in str(err.value)
    path = _write(tmp_path, "TP=2\necho $TP\n")
    with pytest.raises(ConfigError, match="no training launch found"):
        import_script(path.read_text(), str(path))


def test_cli_writes_a_manifest_the_train_command_accepts(tmp_path, capsys):
    out = tmp_path / "job.yaml"
    script = SCRIPTS / "tune_qwen3_14b_4K_full_alpaca_ptd.sh"
    assert engine_main(["import-script", str(script), "-o", str(out), "--namespace", "llm"]) == 0
    err = capsys.readouterr().err
    assert "not imported: --attention-softmax-in-fp32: no TrainConfig field takes this flag" in err
    assert re.search(r"^no effect here \(acceleration switches: .*\): .*--use-flash-attn", err, re.M)
    assert "not imported: --use-flash-attn" not in err
    assert err.strip().splitlines()[-1].startswith(f"import-script: {script} -> {out}: ")
    text = out.read_text()
    assert "#   --attention-softmax-in-fp32: no TrainConfig field takes this flag" in text
    assert re.search(r"^# No effect here \(.*\): .*--use-fused-rmsnorm", text, re.M)
    assert "#   /apps/hw/weights/Qwen3-14B/" in text
    assert yaml.safe_load(text)["metadata"]["namespace"] == "llm"
    # The pods are the chart's Ascend 910B runtime's: the job names it instead of the image (docs/runtimes.md).
    assert yaml.safe_load(text)["spec"]["runtimeRef"] == {"name": "ascend-910b"}
    assert "image" not in yaml.safe_load(text)["spec"]
    assert [p.name for p in tmp_path.iterdir()] == ["job.yaml"]  # no temporary file left behind
    # The engine reads the whole resource back (spec.train) with the same loader as `ascend-engine train`.
    cfg = build_config(TrainConfig, argparse.Namespace(), {}, str(out), section="train")
    assert cfg.parallel.pipelineModelParallelSize == 4 and cfg.training.precision == "bf16"
    assert engine_main(["import-script", str(script), "-o", str(out), "--strict"]) == 1


def test_cli_reports_an_unreadable_script(tmp_path, capsys):
    assert engine_main(["import-script", str(tmp_path / "missing.sh")]) == 2
    assert "missing.sh: cannot read script" in capsys.readouterr().err


def test_importing_a_script_needs_no_torch():
    """import-script runs where torch is absent (a laptop, the operator image): it must not import it."""
    import subprocess
    import sys

    code = ("import sys; from ascend_engine.importer.job import import_script; "
            f"import_script(open({str(SCRIPTS / FIXTURES[0])!r}).read(), 'x.sh'); "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


def test_a_script_with_unresolved_shape_data_and_devices_fails_and_names_them(tmp_path, capsys):
    """Variables the script defines resolve; those it only uses (set in a sourced file, say) are named, and a job
    that would train a default model on synthetic data on one device is not written."""
    text = ("TP=1\nGPT_ARGS=\"--num-layers $NUM_LAYERS --hidden-size 64 --num-attention-heads 4 "
            "--tensor-model-parallel-size $TP\"\n"
            "torchrun --nproc_per_node $NPUS_PER_NODE pretrain_gpt.py $GPT_ARGS --global-batch-size 8\n")
    path = _write(tmp_path, text)
    out = tmp_path / "job.yaml"
    assert engine_main(["import-script", str(path), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "error: variables used but not set in the script: $NUM_LAYERS, $NPUS_PER_NODE" in err
    assert "error: no model shape: --num-layers not resolved" in err
    assert "error: no data: --data-path not resolved" in err
    assert "error: device count lost: torchrun --nproc-per-node is empty" in err
    assert "note: " in err and "$NUM_LAYERS is not set in the script" in err
    assert not out.exists()
    assert engine_main(["import-script", str(path), "-o", str(out), "--allow-incomplete"]) == 0
    capsys.readouterr()
    text = out.read_text()
    assert text.splitlines()[1].startswith("# INCOMPLETE")
    assert yaml.safe_load(text)["spec"]["train"]["parallel"]["tensorModelParallelSize"] == 1  # $TP resolved
    assert engine_main(["import-script", str(path), "-o", str(out), "--set", "NUM_LAYERS=2", "--set",
                        "NPUS_PER_NODE=2", "--allow-incomplete"]) == 0
    assert "$NUM_LAYERS" not in capsys.readouterr().err
    # With TP=2 the lost device count makes the spec invalid; the error says which variable is to blame.
    path = _write(tmp_path, path.read_text().replace("TP=1", "TP=2"))
    assert engine_main(["import-script", str(path), "-o", str(out)]) == 2
    assert "likely because: device count lost: torchrun --nproc-per-node is empty" in capsys.readouterr().err


TOOL_SCRIPTS = SCRIPTS / "tools"  # the seeds' conversion and preprocessing commands, as the documents write them


@pytest.mark.parametrize("name, kind", [("ckpt_convert_qwen25_7b_hf2mcore.sh", "CheckpointConvert"),
                                        ("data_convert_qwen25_alpaca.sh", "DatasetPrep"),
                                        ("data_convert_qwen3_pretrain.sh", "DatasetPrep")])
def test_tool_scripts_become_their_resources(name, kind):
    path = TOOL_SCRIPTS / name
    job = import_script(path.read_text(), str(path))
    (document,) = job.documents
    assert document["kind"] == kind and job.gaps == []
    RESOURCES[kind].spec.model_validate(document["spec"])


def test_convert_ckpt_resolves_the_scripts_variables_and_names_what_it_drops():
    path = TOOL_SCRIPTS / "ckpt_convert_qwen25_7b_hf2mcore.sh"
    job = import_script(path.read_text(), str(path))
    convert = job.tools[0]["spec"]["convert"]
    assert convert["loadDir"] == "/home/fdd/workspace/models/Qwen/Qwen2.5-7B"  # $model_path_hf
    assert convert["saveDir"] == "/home/fdd/workspace/models/Qwen/Qwen2.5-7B/mcore_tp1_pp1/"  # ${TP}, ${PP}
    assert (convert["targetTensorParallelSize"], convert["paramsDtype"]) == (1, "bf16")
    assert any("--add-qkv-bias: no ConvertConfig field takes this flag" in n for n in job.notes)


def test_preprocess_data_keeps_the_handler_and_its_keys(tmp_path, capsys):
    path = TOOL_SCRIPTS / "data_convert_qwen25_alpaca.sh"
    out = tmp_path / "prep.yaml"
    assert engine_main(["import-script", str(path), "-o", str(out)]) == 0
    assert "--cache-dir /home/fdd/workspace/tmp: no PrepConfig field takes this flag" in capsys.readouterr().err
    (document,) = [d for d in yaml.safe_load_all(out.read_text()) if d]
    prep = document["spec"]["prep"]
    assert prep["handlerName"] == "AlpacaStyleInstructionHandler" and prep["seqLength"] == 65536
    assert prep["mapKeys"] == {"prompt": "prompt", "query": "", "response": "response"}


@pytest.mark.parametrize("script, name", [("tune_qwen3_14b_4K_full_ptd.sh", "tune-qwen3-14b-4k-full-ptd"),
                                          ("002-l330.sh", "job-002-l330"), ("__.sh", "imported-job"),
                                          ("x" * 80 + ".sh", "x" * 63)])
def test_default_names_are_dns_1035_labels(script, name):
    from ascend_engine.importer.parts import job_name

    assert job_name(script) == name
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63


def test_keep_as_is_makes_the_scripts_own_torchrun_line_the_trainer(tmp_path, capsys):
    """A seed-style MindSpeed-LLM pretrain script, kept as it is: its flags word for word after pretrain_gpt.py,
    its exports as env (HCCL's in spec.hccl), its torchrun shape as the pods; the manifest passes `ascend-train
    validate` (the CRD's schema and CEL rules, then the model)."""
    from ascend_train.cli import main as train_main

    script = SCRIPTS / "pretrain_qwen3_1point7b_4K_ptd.sh"
    out = tmp_path / "job.yaml"
    assert engine_main(["import-script", str(script), "--keep-as-is", "--image", "team/mindspeed-llm:2.2.0",
                        "--workdir", "/home/MindSpeed-LLM", "-o", str(out)]) == 0
    manifest = yaml.safe_load(out.read_text())
    spec = manifest["spec"]
    assert "train" not in spec and spec["image"] == "team/mindspeed-llm:2.2.0"
    assert (spec["nnodes"], spec["nprocPerNode"], spec["masterPort"]) == (1, 2, 6000)
    assert spec["hccl"] == {"connectTimeout": 1800}
    assert spec["env"] == [{"name": "CUDA_DEVICE_MAX_CONNECTIONS", "value": "1"},
                           {"name": "NPU_ASD_ENABLE", "value": "0"}]
    trainer = spec["trainer"]
    assert trainer["command"] == ["torchrun", "pretrain_gpt.py"] and trainer["workingDir"] == "/home/MindSpeed-LLM"
    launch, _ = find_launch(read_script(script.read_text()))
    assert trainer["args"] == [w for flag, values in launch.flags for w in (flag, *values)]
    args = trainer["args"]
    assert args[args.index("--seq-length") + 1] == "4096" and args[args.index("--save") + 1] == "/workspace/model-out"
    assert "--node_rank" not in args and "--master-addr" not in " ".join(trainer["command"])
    capsys.readouterr()
    assert train_main(["validate", "-f", str(out)]) == 0
    assert "valid" in capsys.readouterr().out
    assert engine_main(["import-script", str(script), "--keep-as-is"]) == 2  # whose image? it must be said


INFERENCE = SCRIPTS / "inference"


def test_acceleration_switches_have_no_effect_and_do_not_make_strict_fail(tmp_path, capsys):
    """Fused kernels, overlaps and MC2 change speed, not results: named apart as 'no effect here'; --strict
    counts only flags that would change the run."""
    script = tmp_path / "tune_fast.sh"
    script.write_text((SCRIPTS / "tune_qwen25_7b_4k_full_ptd.sh").read_text().replace(
        "torchrun $DISTRIBUTED_ARGS posttrain_gpt.py", "torchrun $DISTRIBUTED_ARGS posttrain_gpt.py --use-mc2 "
        "--use-fused-rmsnorm --use-flash-attn --overlap-grad-reduce --no-masked-softmax-fusion"))
    job = import_script(script.read_text(), str(script))
    assert {"--use-mc2", "--use-fused-rmsnorm", "--use-flash-attn", "--overlap-grad-reduce"} <= set(job.no_effect)
    assert not {s.flag for s in job.skipped} & set(job.no_effect)
    strict = 1 if job.skipped else 0  # the fixture's own flags that change the run still count
    assert engine_main(["import-script", str(script), "-o", str(tmp_path / "job.yaml"), "--strict"]) == strict
    assert "no effect here" in capsys.readouterr().err


def test_evaluation_script_becomes_an_evaluation_job_the_evaluate_command_reads(tmp_path, capsys):
    """evaluate_*.sh (evaluation.py) -> an AscendTrainJob with only spec.evaluation: accepted by the API server's
    schema and rules, read back by `ascend-engine evaluate --config` as spec.evaluation; the model's flags are
    the checkpoint's and named in one note."""
    from ascend_engine.config.evaluate import EvaluateConfig

    out = tmp_path / "eval.yaml"
    script = INFERENCE / "evaluate_qwen3_14b_full_mmlu_ptd.sh"
    assert engine_main(["import-script", str(script), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    manifest = yaml.safe_load(out.read_text())
    spec = manifest["spec"]
    assert "train" not in spec and (spec["nnodes"], spec["nprocPerNode"]) == (1, 8)
    AscendTrainJobSpec.model_validate(spec)
    cfg = build_config(EvaluateConfig, argparse.Namespace(), {}, str(out), section="evaluation")
    assert cfg.task == ["mmlu"] and cfg.taskDataPath == ["/apps/hw/datasets/mmlu/data/test"]
    assert cfg.load == "/apps/hw/outputs/qwen3/14b/save_weights_sft/qwen3_14b_mcore_tp2pp4/"
    assert (cfg.tensorModelParallelSize, cfg.pipelineModelParallelSize, cfg.promptType) == (2, 4, "empty")
    assert re.search(r"^note: taken from the checkpoint \(--load\).*--num-layers 40 .*--bf16$", err, re.M)
    assert "not imported: --num-layers" not in err and "not imported: --use-fused-rmsnorm" not in err
    assert "evaluation of mmlu, 1 x 8 devices" in err.splitlines()[-1]
    job = import_script(script.read_text(), str(script), preset={"TASK": "human_eval"})
    assert job.manifest["spec"]["evaluation"]["task"] == ["humaneval"]  # MindSpeed-LLM's spelling


def test_generation_script_becomes_a_generate_command(tmp_path, capsys):
    """generate_*.sh (inference.py) -> a shell script running `ascend-engine generate` with TP x PP processes
    (the checkpoint's layout) and flags the generate command's own parser accepts."""
    import shlex

    from ascend_engine.config.loader import add_flags
    from ascend_engine.generate.config import GenerateConfig

    out = tmp_path / "generate.sh"
    assert engine_main(["import-script", str(INFERENCE / "generate_qwen3_14b_full_ptd.sh"), "-o", str(out)]) == 0
    assert "an ascend-engine generate command" in capsys.readouterr().err
    text = out.read_text()
    assert text.startswith("#!/bin/sh\n")
    line = shlex.split(text.strip().splitlines()[-1])
    assert line[:5] == ["torchrun", "--nproc-per-node=8", "-m", "ascend_engine", "generate"]
    assert line[-2:] == ["--prompt", "$1"]
    parser = argparse.ArgumentParser()
    dests = add_flags(parser, GenerateConfig)
    cfg = build_config(GenerateConfig, parser.parse_args([*line[5:-2], "--prompt", "Hello"]), dests)
    assert cfg.load == "/apps/hw/outputs/qwen3/14b/save_weights_sft/qwen3_14b_mcore_tp2pp4"
    assert (cfg.tokenizerNameOrPath, cfg.maxNewTokens, cfg.seed) == ("/apps/hw/weights/Qwen3-14B/", 256, 42)
