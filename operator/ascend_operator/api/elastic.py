"""``elastic``: the range of pod counts an AscendTrainJob may run at (torchrun's ``--nnodes=MIN:MAX``, Kubeflow's
elasticPolicy minReplicas/maxReplicas, MindCluster's scale-in by data-parallel domains).

``spec.nnodes`` is the desired and largest size; ``elastic.minNodes`` the smallest. Every size in between whose world
size is a multiple of TP x PP (x EP) and whose data-parallel size divides the global batch is one the operator may
restart the job at, from its last checkpoint, with the same global batch (more micro-batches per step).
"""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

from .kube import KubeModel

_TP_PP_EP = ("(self.train.parallel.tensorModelParallelSize * self.train.parallel.pipelineModelParallelSize"
             " * self.train.parallel.expertModelParallelSize)")
_TP_PP = "(self.train.parallel.tensorModelParallelSize * self.train.parallel.pipelineModelParallelSize)"
# The API server's copy of AscendTrainJobSpec's elastic checks, so `kubectl apply` fails early.
ELASTIC_RULES = [
    {"rule": "!has(self.elastic) || has(self.train)",
     "message": "elastic needs train: the operator resizes the engine's data-parallel size (a trainer command "
                "cannot be told its new global batch split)",
     "fieldPath": ".elastic", "reason": "FieldValueForbidden"},
    {"rule": "!has(self.elastic) || self.elastic.minNodes <= self.nnodes",
     "message": "elastic.minNodes must be at most nnodes (nnodes is the desired and largest size)",
     "fieldPath": ".elastic.minNodes", "reason": "FieldValueInvalid"},
    {"rule": "!has(self.elastic) || !has(self.train) || (has(self.train.checkpoint)"
             " && has(self.train.checkpoint.save))",
     "message": "elastic needs train.checkpoint.save: a resize restarts the job from its last checkpoint",
     "fieldPath": ".train.checkpoint.save", "reason": "FieldValueRequired"},
    {"rule": f"!has(self.elastic) || !has(self.train) || (self.elastic.minNodes * self.nprocPerNode) % {_TP_PP_EP}"
             f" == 0",
     "message": "elastic.minNodes x nprocPerNode must be divisible by train.parallel.tensorModelParallelSize x "
                "pipelineModelParallelSize x expertModelParallelSize",
     "fieldPath": ".elastic.minNodes", "reason": "FieldValueInvalid"},
    {"rule": f"!has(self.elastic) || !has(self.train) || (self.elastic.minNodes * self.nprocPerNode) % {_TP_PP} != 0"
             f" || self.train.training.globalBatchSize % (self.train.training.microBatchSize"
             f" * (self.elastic.minNodes * self.nprocPerNode / {_TP_PP})) == 0",
     "message": "train.training.globalBatchSize must be a multiple of microBatchSize x the data-parallel size at "
                "elastic.minNodes",
     "fieldPath": ".elastic.minNodes", "reason": "FieldValueInvalid"},
]


class ElasticPolicy(KubeModel):
    """The pod counts the job may run at, and when it shrinks."""

    minNodes: Annotated[int, Field(ge=1, le=4096)]
    """Fewest pods (torchrun nodes) the job may continue on when the cluster cannot hold nnodes; nnodes is the
    desired and largest size. Sizes in between whose world size TP x PP (x EP) and the global batch do not allow are
    skipped."""
    scaleInTimeoutSeconds: Annotated[int, Field(ge=1, le=86400)] = 90
    """How long a pod of the job may stay unschedulable (PodScheduled False, reason Unschedulable) before the
    operator restarts the job smaller, from its last checkpoint."""


class ElasticStatus(KubeModel):
    """The size an elastic job wants and the size it runs at."""

    desiredNodes: int
    """spec.nnodes."""
    currentNodes: int
    """Pods the job runs at now (NNODES of its pods)."""
    nodes: str
    """currentNodes/desiredNodes, as `kubectl get atj -o wide` prints it."""
    resizes: int = 0
    """Resizes so far (not counted in restarts, nor against runPolicy.backoffLimit)."""
    scaleOutAfterCheckpoint: int | None = None
    """Capacity for more pods came back when the newest checkpoint was this iteration: the job scales out once a
    newer checkpoint exists and resumes from it."""
