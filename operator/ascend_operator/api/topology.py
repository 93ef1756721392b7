"""``spec.topology``: where a gang's pods may be placed, and ranks ordered by where they landed.

Ascend clusters are hierarchical: 8 NPUs a 910B server linked by HCCS, servers in racks, racks (or an Atlas A3
SuperPoD's servers) in a block on one fabric. Tensor-parallel groups want one server, pipeline neighbours one rack
or block, data-parallel replicas can span them. A level is a node label key; nodes that share its value form one
domain of that level (``kubernetes.io/hostname``: one node).

* ``required`` / ``preferred``: the whole gang in one domain of that level. With Kueue the pod set carries Kueue's
  topology request (``kueue.x-k8s.io/podset-required-topology`` / ``-preferred-topology``) and Kueue's
  topology-aware scheduling picks the domain; with ``gangScheduling: kubernetes`` a required level is also the
  PodGroup's topology constraint, which kube-scheduler keeps (TopologyAwareWorkloadScheduling).
* ``tensorParallel``: each tensor-parallel group's pods in one domain of that level (with Kueue: pod set slices of
  the group's pod count, ``kueue.x-k8s.io/podset-slice-required-topology``).
* Once every pod of an attempt is bound, the operator orders ``NODE_RANK`` by ``levels``: the pods of one domain
  get consecutive ranks at every level, so Megatron's tensor-parallel groups (consecutive ranks) and pipeline
  neighbours share the finest domains the placement allows; pod 0 keeps rank 0. The order is in
  ``status.placement`` and each pod's annotation ``ascendtrain.dev/node-rank`` (``ascend_engine.node_rank``).
"""
from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from .kube import KubeModel

HOST = "kubernetes.io/hostname"
RACK = "topology.ascendtrain.dev/rack"
BLOCK = "topology.ascendtrain.dev/block"
DEFAULT_LEVELS = [BLOCK, RACK, HOST]
LEVEL_MAX = 63  # Kueue's limit on a topology request's level
# A label key (apimachinery's qualified name: an optional DNS-subdomain prefix and a name).
LABEL_KEY = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
             r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
Level = Annotated[str, Field(max_length=LEVEL_MAX, pattern=LABEL_KEY)]

_TP = "self.train.parallel.tensorModelParallelSize"
TOPOLOGY_RULES = [
    {"rule": "!has(self.topology) || !has(self.topology.required) || !has(self.topology.preferred)",
     "message": "topology.required and topology.preferred exclude each other: the gang is either held to one "
                "domain or only preferably placed in one",
     "fieldPath": ".topology.preferred", "reason": "FieldValueForbidden"},
    *({"rule": f"!has(self.topology) || !has(self.topology.{field}) || self.topology.{field} in "
               "self.topology.levels",
       "message": f"topology.{field} must be one of topology.levels",
       "fieldPath": f".topology.{field}", "reason": "FieldValueInvalid"}
      for field in ("required", "preferred", "tensorParallel")),
    {"rule": "!has(self.topology) || !has(self.topology.tensorParallel) || has(self.train)",
     "message": "topology.tensorParallel needs train: the tensor-parallel size comes from "
                "train.parallel.tensorModelParallelSize",
     "fieldPath": ".topology.tensorParallel", "reason": "FieldValueForbidden"},
    {"rule": f"!has(self.topology) || !has(self.topology.tensorParallel) || !has(self.train) || {_TP} <= "
             f"self.nprocPerNode || {_TP} % self.nprocPerNode == 0",
     "message": "topology.tensorParallel needs train.parallel.tensorModelParallelSize to be a multiple of "
                "nprocPerNode when it spans pods: a tensor-parallel group is then a whole number of pods",
     "fieldPath": ".topology.tensorParallel", "reason": "FieldValueInvalid"},
]


class TopologySpec(KubeModel):
    """Where the gang's pods may be placed, and NODE_RANK ordered by where they landed."""

    levels: Annotated[list[Level], Field(min_length=1, max_length=8)] = list(DEFAULT_LEVELS)
    """The topology's levels, coarsest first: node label keys (kubernetes.io/hostname for one node). NODE_RANK is
    ordered by them once the pods are placed; the levels below name some of them. The local cluster labels its nodes
    with the default ones (`ascend-train local up --topology`)."""
    required: Level | None = None
    """Every pod in one domain of this level (one block, one rack), or none placed: Kueue's
    podset-required-topology, and with gangScheduling kubernetes the PodGroup's topology constraint."""
    preferred: Level | None = None
    """Every pod in one domain of this level if the cluster can, else in as few as it can (Kueue's
    podset-preferred-topology)."""
    tensorParallel: Level | None = None
    """Each tensor-parallel group's pods in one domain of this level (kubernetes.io/hostname: one server, where
    HCCS links its NPUs): Kueue's pod set slices of tensorModelParallelSize / nprocPerNode pods. Only matters when a
    group spans pods (tensorModelParallelSize above nprocPerNode)."""

    @model_validator(mode="after")
    def _levels(self) -> "TopologySpec":
        if self.required and self.preferred:
            raise ValueError(TOPOLOGY_RULES[0]["message"])
        for field, rule in zip(("required", "preferred", "tensorParallel"), TOPOLOGY_RULES[1:4]):
            if (level := getattr(self, field)) is not None and level not in self.levels:
                raise ValueError(f"{rule['message']} ({level!r} is not in {self.levels})")
        if len(set(self.levels)) != len(self.levels):
            raise ValueError("topology.levels must not repeat a level")
        return self


class PlacementStatus(KubeModel):
    """How the current attempt's pods were placed and the NODE_RANK order that follows (spec.topology)."""

    attempt: int
    """The attempt (gang start) the order is for."""
    podsByRank: str
    """The pod index at each NODE_RANK, in rank order, consecutive runs as ranges: `0-1,3,2` gives rank 2 to pod
    3 and rank 3 to pod 2."""
    domains: dict[str, int] = {}
    """How many domains of each level the pods span."""
    tensorParallelGroups: int | None = None
    """Tensor-parallel groups spanning pods (tensorModelParallelSize above nprocPerNode), with topology.tensorParallel."""
    tensorParallelGroupsSplit: int | None = None
    """Of those, how many span more than one domain of topology.tensorParallel (0: every group in one domain)."""
    time: str | None = None
    """When the order was decided (every pod of the attempt bound)."""
