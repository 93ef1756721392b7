"""A pod's ``NODE_RANK`` decided after placement: the operator orders ranks by where the gang's pods landed.

With ``spec.topology`` the operator cannot know a pod's rank when it creates the pod: kube-scheduler (or Kueue's
topology-aware scheduling) decides where each pod goes, and only then can ranks that share a tensor-parallel group
or are pipeline neighbours be given to pods in the same host, rack or block. So every pod but pod 0 (rank 0 always:
the rendezvous and the metrics live there) starts without its rank, and the operator, once every pod of the attempt
is bound to a node, writes each pod's rank into its annotation ``NODE_RANK_ANNOTATION`` (and the whole order into
the job's ``status.placement``). The kubelet writes the pod's annotations into its downwardAPI file
(``ASCEND_POD_ANNOTATIONS``, the file the stack-dump requests also come through); the launcher reads the rank from
there after importing torch (the two waits overlap), sets ``NODE_RANK`` and ``PET_NODE_RANK`` in its environment,
which torchrun and the workers inherit, and puts it in torchrun's ``--node-rank``.

The operator imports these names, so the two never drift.
"""
from __future__ import annotations

import os
import time

from .stacks import ANNOTATIONS_FILE_ENV, read_annotation
from .telemetry import say

NODE_RANK_ANNOTATION = "ascendtrain.dev/node-rank"
WAIT_ENV = "ASCEND_NODE_RANK_FROM"  # set (to the annotation's key) on the pods whose rank comes after placement
TIMEOUT_ENV = "ASCEND_NODE_RANK_TIMEOUT"  # seconds; the job's masterWaitSeconds
POD_INDEX_ENV = "ASCEND_POD_INDEX"  # the pod's own index (its name's), set on the pods whose rank comes after placement
POLL_S = 0.2


def pod_index() -> int | None:
    """This pod's index, the one in its name, which failure reports name; where ranks follow the pods' indices (no
    ``spec.topology``, or a launch outside the operator) that is NODE_RANK."""
    index = os.environ.get(POD_INDEX_ENV) or os.environ.get("NODE_RANK", "")
    return int(index) if index.isdigit() else None


class NodeRankTimeout(RuntimeError):
    """The operator wrote no rank in time (its gang never completed, or the operator is not running)."""


def resolve(argv: list[str], started: float) -> list[str]:
    """torchrun's arguments with this pod's rank, waiting for it when the pod was created without one; the
    environment gets ``NODE_RANK``/``PET_NODE_RANK``. Unchanged when the rank was known at creation."""
    key = os.environ.get(WAIT_ENV)
    if not key:
        return argv
    if rank := os.environ.get("NODE_RANK"):  # the operator wrote it before the pod started: the kubelet expanded it
        say("torchrun", f"NODE_RANK {rank} (ordered by topology)", started)
        return argv
    path = os.environ.get(ANNOTATIONS_FILE_ENV)
    if not path:
        raise NodeRankTimeout(f"{WAIT_ENV} is set but the pod has no annotations file ({ANNOTATIONS_FILE_ENV})")
    timeout = float(os.environ.get(TIMEOUT_ENV) or 600)
    begun = time.monotonic()
    said = False
    while not (rank := (read_annotation(path, key) or "").strip()).isdigit():
        if time.monotonic() - begun > timeout:
            raise NodeRankTimeout(f"no NODE_RANK after {timeout:.0f} s: the operator writes annotation {key} once "
                                  "every pod of the gang is bound to a node (spec.topology)")
        if not said:  # said again every few seconds by telemetry until the workers start
            say("torchrun", "waiting for NODE_RANK: the operator orders the ranks by topology once every pod is "
                            "placed", started)
            said = True
        time.sleep(POLL_S)
    os.environ["NODE_RANK"] = os.environ["PET_NODE_RANK"] = rank
    say("torchrun", f"NODE_RANK {rank} (ordered by topology)", started)
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg.startswith(("--node-rank=", "--node_rank=")):
            out.append(f"--node-rank={rank}")
        elif arg in ("--node-rank", "--node_rank") and i + 1 < len(argv):
            out.append(f"--node-rank={rank}")
            skip = True
        else:
            out.append(arg)
    return out
