"""Data-parallel evaluation: each data-parallel replica (one TP x PP model) answers its own contiguous share of
a task's questions, and the answers are gathered back in the original order, so a world larger than TP x PP
divides the work instead of repeating it."""
from __future__ import annotations


def share(items: list, dp_rank: int, dp: int) -> list:
    """This replica's contiguous share of ``items`` (sizes differ by at most one; a share may be empty)."""
    base, extra = divmod(len(items), dp)
    start = dp_rank * base + min(dp_rank, extra)
    return items[start: start + base + (dp_rank < extra)]


def gather(mine: list, dp: int) -> list:
    """Every replica's ``mine`` concatenated in replica order, on every rank (collective over the world)."""
    if dp == 1:
        return mine
    import torch
    from megatron.core import parallel_state

    shares: list = [None] * dp
    torch.distributed.all_gather_object(shares, mine, group=parallel_state.get_data_parallel_group())
    return [item for s in shares for item in s]
