"""Node ports for hostNetwork jobs: each job owns one block of the operator's range, so jobs on one node
never bind the same port (MASTER_PORT, rank 0's metrics, HCCL_IF_BASE_PORT and the ports HCCL takes above it).

The block starts at a hash of the job's uid (stable across operator restarts) and moves to the next free one
when another live job holds it.
"""
from __future__ import annotations

import hashlib
from collections.abc import Collection

HCCL_OFFSET = 16  # HCCL_IF_BASE_PORT sits 16 ports into the block; HCCL counts up from there


def blocks_in(first: int, last: int, size: int) -> int:
    return (last - first + 1) // size


def choose_block(uid: str, taken: Collection[int], blocks: int) -> int:
    """The job's block: its uid's hash, or the next one not taken by another job."""
    if len(taken) >= blocks:
        raise ValueError(f"all {blocks} host port blocks are taken by live hostNetwork jobs; widen "
                         "ASCEND_OPERATOR_HOST_PORTS or wait for a job to finish")
    start = int.from_bytes(hashlib.sha256(uid.encode()).digest()[:8], "big") % blocks
    return next(b for b in ((start + i) % blocks for i in range(blocks)) if b not in taken)


def ports(block: int, first: int, size: int) -> dict[str, int]:
    base = first + block * size
    return {"block": block, "masterPort": base, "metricsPort": base + 1, "hcclIfBasePort": base + HCCL_OFFSET}
