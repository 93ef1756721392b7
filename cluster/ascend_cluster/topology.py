"""Topology labels for the local cluster's nodes (``ascend-train local up --topology blocks=B,racks=R``).

A real Ascend cluster is hierarchical: servers (one Kubernetes node each: ``kubernetes.io/hostname``) in racks,
racks in blocks (an Atlas A3 SuperPoD, a fabric domain). The local cluster's nodes get the same shape as labels, as
a cloud's or MindCluster's node labelling would give them: nodes in order fill ``R`` racks per block, ``B``
blocks, as evenly as the node count allows (``node-1``, ``node-2`` in rack-0, ``node-3``, ``node-4`` in rack-1 for
4 nodes, one block and two racks). Label values are unique across the cluster (``rack-3`` is one rack wherever it
is), since kube-scheduler's topology constraint reads a label's value alone as the domain.

With Kueue (``--kueue``) the cluster also gets Kueue's ``Topology`` named ``TOPOLOGY_NAME`` with these levels,
which a ResourceFlavor names in ``topologyName`` for topology-aware scheduling (docs/queues.md).
"""
from __future__ import annotations

BLOCK = "topology.ascendtrain.dev/block"  # the operator's default levels (operator/ascend_operator/api/topology.py)
RACK = "topology.ascendtrain.dev/rack"
HOST = "kubernetes.io/hostname"
LEVELS = (BLOCK, RACK, HOST)
TOPOLOGY_NAME = "ascend-topology"


def parse(text: str) -> tuple[int, int]:
    """``blocks=B,racks=R`` (either may be left out: 1) -> (B, R racks per block)."""
    found = {"blocks": 1, "racks": 1}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        if key not in found or not value.isdigit() or int(value) < 1:
            raise ValueError(f"--topology wants blocks=B,racks=R with positive counts (got {text!r})")
        found[key] = int(value)
    return found["blocks"], found["racks"]


def node_labels(nodes: list[str], blocks: int, racks_per_block: int) -> dict[str, dict[str, str]]:
    """Each node's block and rack labels: consecutive nodes share a rack, consecutive racks a block."""
    racks = blocks * racks_per_block
    if len(nodes) < racks:
        raise ValueError(f"{len(nodes)} node(s) cannot fill {blocks} block(s) of {racks_per_block} rack(s)")
    out = {}
    for i, node in enumerate(nodes):
        rack = i * racks // len(nodes)
        out[node] = {BLOCK: f"block-{rack // racks_per_block}", RACK: f"rack-{rack}"}
    return out


def kueue_topology() -> dict:
    """Kueue's Topology object for these levels."""
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Topology", "metadata": {"name": TOPOLOGY_NAME},
            "spec": {"levels": [{"nodeLabel": level} for level in LEVELS]}}
