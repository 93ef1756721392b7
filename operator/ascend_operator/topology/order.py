"""NODE_RANK by topology, as pure functions: the pods of one domain get consecutive ranks, at every level.

MindCluster builds its rank table the same way (servers sorted within super-pods): with Megatron's rank order
(tensor-parallel fastest, then data-parallel, then pipeline stages), consecutive ranks form the tensor-parallel
groups, and a block of consecutive ranks holds whole pipeline neighbourhoods, so keeping each domain's ranks
together keeps those groups inside the finest domains the placement allows.

The order is a tree walk: pods are grouped by their value of each level (coarsest first), then by node; at each
level the domains come in the order of the smallest pod index they hold, and the pods of one node by index. So pod
0 is always rank 0 (it hosts the rendezvous and rank 0's metrics), and a placement that already keeps consecutive
indices together (Kueue's topology-aware assignment by pod index) keeps NODE_RANK = pod index.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence


def rank_order(nodes: Mapping[int, str], node_labels: Mapping[str, Mapping[str, str]],
               levels: Sequence[str]) -> list[int]:
    """The pod indices in NODE_RANK order, from each pod's node (``nodes``: index -> node name) and the nodes'
    labels. A node without a level's label is a domain of its own at that level (as Kueue counts it: no value)."""
    def path(index: int) -> tuple[str, ...]:
        node = nodes[index]
        labels = node_labels.get(node) or {}
        return (*(labels.get(level, f"\0{node}") for level in levels), node)

    def walk(indices: list[int], depth: int) -> list[int]:
        if depth == len(levels) + 1:
            return sorted(indices)
        groups: dict[str, list[int]] = {}
        for i in indices:
            groups.setdefault(path(i)[depth], []).append(i)
        out: list[int] = []
        for members in sorted(groups.values(), key=min):
            out += walk(members, depth + 1)
        return out

    return walk(sorted(nodes), 0)


def domains(nodes: Mapping[int, str], node_labels: Mapping[str, Mapping[str, str]],
            levels: Sequence[str]) -> dict[str, int]:
    """How many domains of each level the pods span."""
    return {level: len({(node_labels.get(n) or {}).get(level, f"\0{n}") for n in nodes.values()})
            for level in levels}


def split_groups(order: Sequence[int], nodes: Mapping[int, str], node_labels: Mapping[str, Mapping[str, str]],
                 level: str, group_pods: int) -> tuple[int, int]:
    """(tensor-parallel groups, those spanning more than one domain of ``level``): a group is ``group_pods``
    consecutive ranks."""
    if group_pods <= 1:
        return 0, 0
    groups = [order[i:i + group_pods] for i in range(0, len(order), group_pods)]
    split = sum(1 for g in groups if len({(node_labels.get(nodes[i]) or {}).get(level, f"\0{nodes[i]}")
                                          for i in g}) > 1)
    return len(groups), split


def ranges(order: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 4, 3]`` -> ``"0-2,5,4,3"``: increasing runs of consecutive indices as ranges."""
    parts: list[str] = []
    start = prev = None
    for i in order:
        if prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = i
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def parse_ranges(text: str) -> list[int]:
    """The inverse of ``ranges``."""
    out: list[int] = []
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        out += range(int(first), int(last or first) + 1)
    return out
