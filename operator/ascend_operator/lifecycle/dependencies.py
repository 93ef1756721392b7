"""Pipelines: a job may name the jobs whose outputs it needs; it waits for them, then uses what they wrote.

Pure functions of the referenced objects (as the API returns them), so every case is unit-tested:
AscendTrainJob <- DatasetPrep (outputs -> train.data.dataPath) and CheckpointConvert (its Megatron output ->
train.checkpoint.load with finetune); CheckpointConvert <- AscendTrainJob (its checkpoint.save -> convert.loadDir).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ascend_engine.config.prep import PrepConfig

from ..api.group import CHECKPOINT_CONVERT, DATASET_PREP, TRAIN_JOB, Kind
from ..api.single_pod import CheckpointConvertSpec
from ..api.train_job import AscendTrainJobSpec


@dataclass(frozen=True)
class Ref:
    kind: Kind
    name: str
    field: str  # the spec field that names it, for messages

    def __str__(self) -> str:
        return f"{self.kind.kind} {self.name}"


# The spec fields that name another job, by the kind of the job that has them.
_REF_FIELDS = {TRAIN_JOB.kind: ((DATASET_PREP, "datasetPrepRef"), (CHECKPOINT_CONVERT, "checkpointConvertRef")),
               CHECKPOINT_CONVERT.kind: ((TRAIN_JOB, "trainJobRef"),)}


def stored_refs(kind: str, spec: dict[str, Any]) -> list[Ref]:
    """The references in a stored object's spec (``kind``: its kind's name)."""
    return [Ref(target, spec[field], field) for target, field in _REF_FIELDS.get(kind, ()) if spec.get(field)]


def refs(spec: Any) -> list[Ref]:
    kind = TRAIN_JOB if isinstance(spec, AscendTrainJobSpec) else \
        CHECKPOINT_CONVERT if isinstance(spec, CheckpointConvertSpec) else None
    return stored_refs(kind.kind, {field: getattr(spec, field) for _, field in _REF_FIELDS[kind.kind]}) if kind else []


def unusable(ref: Ref, obj: dict[str, Any]) -> str | None:
    """Why the referenced object, as its spec stands, can never feed this job (known once it exists, not only
    after it has run)."""
    spec = obj.get("spec") or {}
    if ref.kind is CHECKPOINT_CONVERT and (spec.get("convert") or {}).get("saveModelType", "mg") != "mg":
        return f"{ref} writes a HuggingFace model; spec.{ref.field} needs a Megatron one (convert.saveModelType mg)"
    if ref.kind is TRAIN_JOB:
        train = spec.get("train") or {}
        checkpoint = train.get("checkpoint") or {}
        if not checkpoint.get("save"):
            return f"{ref} has no train.checkpoint.save: there is no checkpoint to convert"
        if (train.get("lora") or {}).get("loraR") and not checkpoint.get("load"):
            return f"{ref} trains LoRA adapters but has no train.checkpoint.load: no base to merge into"
    return None


def readiness(found: dict[Ref, dict[str, Any] | None]) -> tuple[str, str]:
    """("Ready" | "Waiting" | "Failed" | "Invalid", message) for the referenced objects (None: not found)."""
    invalid = [problem for ref, obj in found.items() if obj is not None and (problem := unusable(ref, obj))]
    if invalid:
        return "Invalid", "; ".join(invalid)
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


def cycle(kind: Kind, name: str, found: dict[Ref, dict[str, Any] | None],
          read: Callable[[Ref], dict[str, Any] | None]) -> str | None:
    """The chain of references that leads from this job back to itself, or None. Every job on such a chain
    waits for the next one, so none of them would ever start."""
    paths = [(obj, [ref]) for ref, obj in found.items() if obj is not None]
    seen = set()
    while paths:
        obj, path = paths.pop()
        for ref in stored_refs(path[-1].kind.kind, obj.get("spec") or {}):
            chain = [*path, ref]
            if (ref.kind, ref.name) == (kind, name):
                return ("dependency cycle: " + ", whose ".join(f"spec.{r.field} names {r}" for r in chain) +
                        ", this job: none of them can start until one of the references is removed")
            if (ref.kind, ref.name) not in seen and (nxt := read(ref)) is not None:
                seen.add((ref.kind, ref.name))
                paths.append((nxt, chain))
    return None


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
    """The spec with its references replaced by what they produced (a copy; the stored spec is untouched), once
    ``readiness`` says they are ready."""
    spec = spec.model_copy(deep=True)
    for ref, obj in found.items():
        if ref.kind is DATASET_PREP:
            _use_dataset(spec.train.data, PrepConfig.model_validate(obj["spec"]["prep"]), _outputs(obj))
        elif ref.kind is CHECKPOINT_CONVERT:
            convert = obj["spec"]["convert"]
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
            spec.convert = spec.convert.model_copy(update=_convert_from_job(spec.convert, obj))
    return spec


def _convert_from_job(convert: Any, obj: dict[str, Any]) -> dict[str, Any]:
    """Convert what a training job saved (``unusable`` has checked there is something). A LoRA job saved only
    adapters: merge them into the base it trained on (its checkpoint.load), with its own rank, alpha and target
    modules unless the conversion names them."""
    train = obj["spec"].get("train") or {}
    checkpoint, lora = train.get("checkpoint") or {}, train.get("lora") or {}
    if not lora.get("loraR"):
        return {"loadDir": checkpoint["save"]}
    return {"loadDir": checkpoint["load"], "loraLoad": checkpoint["save"],
            "loraR": convert.loraR or lora["loraR"],
            "loraAlpha": convert.loraAlpha or lora.get("loraAlpha", 32.0),
            "loraTargetModules": convert.loraTargetModules or lora.get("loraTargetModules")}
