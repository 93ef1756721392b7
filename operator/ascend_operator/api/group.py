"""Names of the API group and its kinds, in one place."""
from __future__ import annotations

from dataclasses import dataclass

API_GROUP = "ascendtrain.dev"
API_VERSION = "v1alpha1"


@dataclass(frozen=True)
class Kind:
    kind: str
    plural: str
    singular: str
    short: str

    @property
    def api_version(self) -> str:
        return f"{API_GROUP}/{API_VERSION}"

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{API_GROUP}"


TRAIN_JOB = Kind("AscendTrainJob", "ascendtrainjobs", "ascendtrainjob", "atj")
DATASET_PREP = Kind("DatasetPrep", "datasetpreps", "datasetprep", "dsp")
CHECKPOINT_CONVERT = Kind("CheckpointConvert", "checkpointconverts", "checkpointconvert", "ckc")
KINDS = (TRAIN_JOB, DATASET_PREP, CHECKPOINT_CONVERT)
# Training runtimes (api/runtime.py): the pod-level defaults a platform team sets once, which jobs name in
# spec.runtimeRef. They run nothing, so they are not among KINDS (the kinds the operator reconciles).
TRAINING_RUNTIME = Kind("AscendTrainingRuntime", "ascendtrainingruntimes", "ascendtrainingruntime", "atr")
CLUSTER_TRAINING_RUNTIME = Kind("ClusterAscendTrainingRuntime", "clusterascendtrainingruntimes",
                                "clusterascendtrainingruntime", "catr")
RUNTIME_KINDS = (TRAINING_RUNTIME, CLUSTER_TRAINING_RUNTIME)

# Labels and annotations the operator puts on what it creates.
LABEL_JOB_NAME = f"{API_GROUP}/job-name"
LABEL_JOB_KIND = f"{API_GROUP}/job-kind"
LABEL_REPLICA_INDEX = f"{API_GROUP}/replica-index"
LABEL_ATTEMPT = f"{API_GROUP}/attempt"  # which gang (re)start a pod belongs to: attempts.py
# The finalizer on every pod the operator creates: a pod deleted while the operator was not looking (PodGC after a
# node was deleted, an eviction) stays, with its last status, until the operator has recorded how it ended
# (``pod_cache``, ``lifecycle.reconcile._release``); as batch/v1 Jobs keep batch.kubernetes.io/job-tracking.
POD_FINALIZER = f"{API_GROUP}/pod-tracking"
