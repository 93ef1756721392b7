"""DatasetPrep and CheckpointConvert: one pod each; progress in units done, the engine's report as outputs."""
from ..api.group import CHECKPOINT_CONVERT, DATASET_PREP
from ..api.single_pod import CheckpointConvertSpec, DatasetPrepSpec
from ..render import single_pod as render
from ..lifecycle.kinds import JobKind, register

_WORK_PROGRESS = {"iteration": "done", "trainIters": "total", "percent": "percent", "etaSeconds": "etaSeconds"}


def _finished(done: int | None) -> dict:
    """Done/Percent once the engine reports success: its own count of the units it worked through."""
    return {"percent": 100.0, "etaSeconds": 0} | ({"done": done, "total": done} if done is not None else {})

register(JobKind(
    kind=DATASET_PREP,
    spec_model=DatasetPrepSpec,
    replicas=lambda spec: 1,
    render=lambda name, ns, spec: render.objects(DATASET_PREP.kind, name, spec, spec.prep, "preprocess"),
    metrics_port=lambda spec: spec.metricsPort,
    progress_fields=_WORK_PROGRESS,
    result_field="outputs",
    final_progress=lambda result: _finished((result.get("records") or {}).get("read")),  # records
))

register(JobKind(
    kind=CHECKPOINT_CONVERT,
    spec_model=CheckpointConvertSpec,
    replicas=lambda spec: 1,
    render=lambda name, ns, spec: render.objects(CHECKPOINT_CONVERT.kind, name, spec,
                                             spec.convert.engine_config(), "convert"),
    metrics_port=lambda spec: spec.metricsPort,
    progress_fields=_WORK_PROGRESS,
    result_field="outputs",
    final_progress=lambda result: _finished(result.get("layers")),  # layers, as the converter counts them
))
