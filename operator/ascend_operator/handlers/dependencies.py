"""Pipelines: a job may name the jobs whose outputs it needs; it waits for them, then uses what they wrote.

Pure functions of the referenced objects (as the API returns them), so every case is unit-tested:
AscendTrainJob <- DatasetPrep (outputs -> train.data.dataPath) and CheckpointConvert (its Megatron output ->
train.checkpoint.load with finetune); CheckpointConvert <- AscendTrainJob (its checkpoint.save -> convert.loadDir).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ascend_engine.config.prep import PrepConfig

from ..api.group import CHECKPOINT_CONVERT, DATASET_PREP, TRAIN_JOB, Kind
from ..api.single_pod import CheckpointConvertSpec
from ..api.train_job import AscendTrainJobSpec


class DependencyError(ValueError):
    """A dependency succeeded but cannot feed this job (its output is of the wrong kind)."""


@dataclass(frozen=True)
class Ref:
    kind: Kind
    name: str
    field: str  # the spec field that names it, for messages

    def __str__(self) -> str:
        return f"{self.kind.kind} {self.name}"


def refs(spec: Any) -> list[Ref]:
    if isinstance(spec, AscendTrainJobSpec):
        return [r for r in (Ref(DATASET_PREP, spec.datasetPrepRef, "datasetPrepRef") if spec.datasetPrepRef else None,
                            Ref(CHECKPOINT_CONVERT, spec.checkpointConvertRef, "checkpointConvertRef")
                            if spec.checkpointConvertRef else None) if r]
    if isinstance(spec, CheckpointConvertSpec) and spec.trainJobRef:
        return [Ref(TRAIN_JOB, spec.trainJobRef, "trainJobRef")]
    return []


def readiness(found: dict[Ref, dict[str, Any] | None]) -> tuple[str, str]:
    """("Ready" | "Waiting" | "Failed", message) for the referenced objects (None: not found)."""
    waiting, failed = [], []
    for ref, obj in found.items():
        phase = ((obj or {}).get("status") or {}).get("phase")
        if obj is None:
            waiting.append(f"{ref} (spec.{ref.field}) does not exist yet")
        elif phase == "Failed":
            failed.append(f"{ref} (spec.{ref.field}) failed")
        elif phase != "Succeeded":
            waiting.append(f"{ref} is {phase or 'Pending'}")
    if failed:
        return "Failed", "; ".join(failed)
    if waiting:
        return "Waiting", "waiting for " + "; ".join(waiting)
    return "Ready", "dependencies succeeded: " + ", ".join(str(r) for r in found) if found else "no dependencies"


def _outputs(obj: dict[str, Any]) -> dict[str, Any]:
    return (obj.get("status") or {}).get("outputs") or {}


def _use_dataset(data: Any, prep: PrepConfig, out: dict[str, Any]) -> None:
    """Train on what the prep wrote, the way MindSpeed-LLM is told: pretraining reads each
    ``<prefix>_<key>_document``; instruction data is the bare prefix with --is-instruction-dataset (the
    packed input_ids / attention_mask / labels files are one dataset, not three); pairwise data likewise with
    --is-pairwise-dataset. The prep's tokenizer becomes the run's unless the job names one."""
    data.tokenizerNameOrPath = data.tokenizerNameOrPath or prep.tokenizerNameOrPath
    if prep.is_pretrain:
        data.dataPath = out.get("datasets") or [f"{prep.outputPrefix}_{key}_document" for key in prep.jsonKeys]
        return
    data.dataPath = [out.get("outputPrefix") or prep.outputPrefix]
    if prep.is_pairwise:  # the six chosen/rejected files, for the dpo, simpo and orm stages
        data.isPairwiseDataset = True
        return
    data.isInstructionDataset = True
    data.neatPack = prep.neatPack


def resolve(spec: Any, found: dict[Ref, dict[str, Any]], status: dict[str, Any]) -> Any:
    """The spec with its references replaced by what they produced (a copy; the stored spec is untouched)."""
    spec = spec.model_copy(deep=True)
    for ref, obj in found.items():
        if ref.kind is DATASET_PREP:
            _use_dataset(spec.train.data, PrepConfig.model_validate(obj["spec"]["prep"]), _outputs(obj))
        elif ref.kind is CHECKPOINT_CONVERT:
            convert = obj["spec"]["convert"]
            if convert.get("saveModelType", "mg") != "mg":
                raise DependencyError(f"{ref} writes a HuggingFace model; spec.{ref.field} needs a Megatron "
                                      "one (convert.saveModelType mg)")
            resumable = ((status.get("progress") or {}).get("lastCheckpointIteration") and
                         spec.train.checkpoint.save)
            converted = _outputs(obj).get("saveDir") or convert["saveDir"]
            if spec.train.stage in ("dpo", "grpo") and not spec.train.lora.loraR and \
                    not spec.train.preference.refModel:
                spec.train.preference.refModel = converted  # the frozen reference, also after a restart resumes
            if not resumable:  # otherwise the job's own latest checkpoint (load = save) wins
                spec.train.checkpoint.load = converted
                spec.train.checkpoint.finetune = True
        elif ref.kind is TRAIN_JOB:
            spec.convert = spec.convert.model_copy(update=_convert_from_job(spec.convert, ref, obj))
    return spec


def _convert_from_job(convert: Any, ref: Ref, obj: dict[str, Any]) -> dict[str, Any]:
    """Convert what a training job saved. A LoRA job saved only adapters: merge them into the base it trained
    on (its checkpoint.load), with its own rank, alpha and target modules unless the conversion names them."""
    train = obj["spec"].get("train") or {}
    checkpoint, lora = train.get("checkpoint") or {}, train.get("lora") or {}
    if not checkpoint.get("save"):
        raise DependencyError(f"{ref} has no train.checkpoint.save: there is no checkpoint to convert")
    if not lora.get("loraR"):
        return {"loadDir": checkpoint["save"]}
    if not checkpoint.get("load"):
        raise DependencyError(f"{ref} trains LoRA adapters but has no train.checkpoint.load: no base to merge into")
    return {"loadDir": checkpoint["load"], "loraLoad": checkpoint["save"],
            "loraR": convert.loraR or lora["loraR"],
            "loraAlpha": convert.loraAlpha or lora.get("loraAlpha", 32.0),
            "loraTargetModules": convert.loraTargetModules or lora.get("loraTargetModules")}
