"""AscendTrainJob: a Service, a ConfigMap, an optional PodGroup and nnodes pods; progress from rank 0."""
from ascend_engine.telemetry import METRIC_NAMES

from . import plan
from ..api.group import TRAIN_JOB
from ..api.train_job import AscendTrainJobSpec, TrainProgress
from ..render import train_job as render
from ..recovery import resize as elastic
from ..client.kubeclient import kube
from ..lifecycle.kinds import JobKind, register


def prepare(obj, spec, status):
    """Host ports and the elastic size (recovery/resize.py), and ``status.plan``: the memory estimate the job was
    admitted with (common.parse_spec refuses one that cannot fit), warned about once when near the device's memory."""
    spec, extra = elastic.prepare(obj, spec, status)
    estimate = plan.job_plan(spec)
    if estimate is None:
        return spec, extra
    if not status.get("plan") and (near := plan.warning(estimate)):
        kube().post_event(obj, plan.NEAR, near, warning=True)
    return spec, {**extra, "plan": estimate.status()}


register(JobKind(
    kind=TRAIN_JOB,
    spec_model=AscendTrainJobSpec,
    replicas=lambda spec: spec.nnodes,
    render=render.objects,
    metrics_port=lambda spec: spec.train.observability.metricsPort if spec.train else
    spec.trainer.metricsPort if spec.trainer else None,
    progress_fields={field: field for field in METRIC_NAMES.values()},
    result_field="progress",
    prepare=prepare,
    resize=elastic.resize,
    progress_columns=TrainProgress.with_columns,
    reporting_pods=lambda spec: [0, spec.nnodes - 1] if spec.trainer else [0],
    stall_detection=lambda spec: spec.runPolicy.stallDetection if spec.train and spec.train.observability.metricsPort
    and spec.runPolicy.stallDetection.enabled else None,
    rank_order=render.rank_order,
))
